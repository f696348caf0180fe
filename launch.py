"""Start HeadInfer Studio: load a model once, then serve the document Q&A page.

    python launch.py                       # embedded SmolLM2-135M, http://127.0.0.1:7860
    python launch.py --model Qwen/Qwen2.5-7B-Instruct --gpu-memory 20GiB --share
    python launch.py --kv-cache-dir /mnt/nvme/kv --kv-cache-max 200GiB   # where read books are kept
"""

from __future__ import annotations

import argparse
import logging
import re
import socket
import sys

log = logging.getLogger("headinfer.launch")

SHARE_SERVER = ("api.gradio.app", 443)  # where Gradio asks for a share tunnel
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


def _credentials(text: str) -> tuple[str, str]:
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise argparse.ArgumentTypeError("write --auth as user:password")
    return user, password


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch.py",
        description="HeadInfer Studio: ask questions of whole books with an LLM whose KV cache is "
                    "offloaded head by head to host RAM.",
    )
    model = parser.add_argument_group("model")
    model.add_argument("--model", default=None, metavar="PATH_OR_ID",
                       help="a local model folder, a .gguf file or a Hugging Face Hub id "
                            "(default: the embedded SmolLM2-135M-Instruct, which needs no download "
                            "once converted)")
    model.add_argument("--device", default="auto",
                       help="compute device: auto (CUDA when available, else CPU), cpu, cuda or cuda:N "
                            "(default: auto)")
    model.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                       help="weight and KV-cache precision; auto is bfloat16 on a GPU and float32 on the CPU "
                            "(default: auto)")
    memory = parser.add_argument_group("memory and offload")
    memory.add_argument("--gpu-memory", type=parse_size, default=None, metavar="SIZE",
                        help="GPU memory budget, e.g. 20GiB (default: ~92%% of the GPU)")
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
                        help="tokens (documents + conversation) to reserve in host memory up front "
                             "(default: sized per document set)")
    memory.add_argument("--host-attention", default=None, choices=["auto", "off", "all"],
                        help="where decode attends offloaded KV: auto splits it between streaming to the GPU "
                             "and computing on the CPU, where it lives, so both finish together; all: on the "
                             "CPU; off: streamed (default: auto)")
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
                        help="address to listen on; 0.0.0.0 lets other machines on the network connect "
                             "(default: 127.0.0.1, this machine only)")
    server.add_argument("--port", type=_positive_int, default=7860, help="port to listen on (default: 7860)")
    server.add_argument("--share", action="store_true",
                        help="also create a temporary public gradio.live link (needs internet; without it "
                             "the app says so and keeps serving locally)")
    server.add_argument("--auth", type=_credentials, default=None, metavar="USER:PASSWORD",
                        help="require this user name and password to open the page")
    return parser


def make_policy(args: argparse.Namespace):
    """The engine's OffloadPolicy from the parsed flags (None leaves a knob to the planner)."""
    from engine import OffloadPolicy

    knobs = {"chunk_size": args.chunk_size, "head_group_size": args.head_group, "max_context": args.max_context,
             "gpu_memory": args.gpu_memory, "host_memory": args.host_memory, "host_attention": args.host_attention}
    return OffloadPolicy(**{name: value for name, value in knobs.items() if value is not None})


def make_snapshot_store(args: argparse.Namespace):
    """The engine's SnapshotStore from the flags; None when turned off or when its folder is unusable
    (the app then reads every document the slow way rather than refusing to start)."""
    if args.no_kv_cache:
        return None
    from engine import SnapshotStore, format_bytes

    try:
        store = SnapshotStore(args.kv_cache_dir, max_bytes=args.kv_cache_max)
    except OSError as exc:
        log.warning("Documents will not be saved for reopening: cannot use %s as the KV-cache folder (%s)",
                    args.kv_cache_dir or "the default folder", exc)
        return None
    limit = "no size limit" if store.max_bytes is None else f"at most {format_bytes(store.max_bytes)}"
    log.info("saving read documents to %s (%s)", store.root, limit)
    return store


def can_reach_share_server(timeout: float = 3.0) -> bool:
    """Whether Gradio's share server answers; checked first so an offline start is quick and
    says plainly why there is no public link."""
    try:
        with socket.create_connection(SHARE_SERVER, timeout=timeout):
            return True
    except OSError as exc:
        log.debug("share server unreachable: %s", exc)
        return False


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    from app.ui import build_ui, launch_options
    from engine import DocumentSession, ModelSourceError, UnsupportedModelError, describe, load_model

    try:
        model, tokenizer = load_model(args.model, device=args.device, dtype=args.dtype)
        policy = make_policy(args)
    except (UnsupportedModelError, ModelSourceError, ValueError) as exc:
        log.error("%s", exc)
        sys.exit(1)
    info = describe(model)
    log.info("model ready: %s on %s (%s)", info.get("name_or_path"), info.get("device"), info.get("dtype"))

    demo = build_ui(lambda: DocumentSession(model, tokenizer, policy), model_info=info,
                    snapshot_store=make_snapshot_store(args))
    share = args.share and can_reach_share_server()
    if args.share and not share:
        log.warning("Could not create a share link: %s:%d is unreachable (no internet?). "
                    "Serving locally only at http://%s:%d", *SHARE_SERVER, args.host, args.port)
    demo.launch(server_name=args.host, server_port=args.port, share=share, auth=args.auth,
                prevent_thread_lock=True, **launch_options())
    if share and not demo.share_url:
        log.warning("Could not create a share link (see Gradio's message above). Serving locally only at %s",
                    demo.local_url)
    elif share:
        log.info("public link: %s", demo.share_url)
    demo.block_thread()


if __name__ == "__main__":
    main()
