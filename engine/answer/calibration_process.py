"""The retrieval-head calibration's child process (``retrieval_heads._calibrate_in_child``): loads the model as the
parent did, calibrates it, writes the disk cache the parent reads. Run as ``python -m engine.answer.calibration_process
<request JSON>``, at nice 19 (the parent sets it). A module of its own: it imports the loader, which the answer wing
below it must not."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

import engine  # noqa: F401  (registers the "headinfer" attention the calibration's cache needs)
from ..models.loader import load_model

from .retrieval_heads import _find, _write_cached, cached_heads_path


def main(request: dict) -> None:
    parent = request["parent"]

    def exit_with_parent() -> None:  # a calibration nobody waits for would hold the cores for minutes
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=exit_with_parent, daemon=True).start()
    model, tokenizer = load_model(**request["arguments"])
    depths = tuple(request["depths"])
    heads = _find(model, tokenizer, request["num_heads"], request["num_sentences"], depths, None)
    _write_cached(cached_heads_path(model, request["num_heads"], Path(request["cache_dir"])), heads,
                  request["num_sentences"], depths)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main(json.loads(sys.argv[1]))
