"""Start HeadInfer Studio: load a model once, then serve the document Q&A page.

    python launch.py                       # Qwen2.5-Coder-1.5B-Instruct from PyPI, http://127.0.0.1:7860
    python launch.py --model Qwen/Qwen2.5-7B-Instruct --gpu-memory 20GiB --share
    python launch.py --kv-cache-dir /mnt/nvme/kv --kv-cache-max 200GiB   # where read books are kept
    python launch.py --self-check --kv-8bit int8   # is the engine exact here, with these features? (then exits)

The flags and the checks that need no torch are ``app/cli.py``; the model, plan, self-check and serving steps
``app/startup.py``. ``headinfer-studio`` (pyproject.toml) runs this ``main``.
"""

from __future__ import annotations

import sys

from app.cli import add_user, build_parser, can_reach_share_server
from app.startup import (build_page, check_start, load_served_model, self_check_now, serve_backend, serve_page,
                         share_link)
from process_env import prepare_process


def main(argv: list[str] | None = None) -> None:
    prepare_process()  # allocator, OpenMP, malloc, Windows shape: before torch loads (every torch import is below)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.add_user is not None:  # writes the users file and exits: no model, no port
        sys.exit(add_user(parser, args))
    if args.backend is not None or args.backend_key_file is not None:  # no model here: the backend answers
        sys.exit(serve_backend(parser, args, can_reach_share_server))
    if args.self_check:  # needs neither the model nor the port (the app may be serving on it meanwhile)
        sys.exit(self_check_now(parser, args))
    start = check_start(parser, args)  # flags, machine, the model's config, the port: one line and exit 2 if bad
    served = load_served_model(parser, args, start)
    page = build_page(args, start, served)
    share = share_link(args, can_reach_share_server)  # (looked up here: a test replaces it in a child)
    serve_page(page, args, start, served, share)


if __name__ == "__main__":
    main()
