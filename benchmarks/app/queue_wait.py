"""A question from a second tab during a first tab's long read: how long it waits for the compute device, with the
read giving way (between chunks, and on a CPU between decoder layers) and without (the read keeps the front of the
line to its end, as before).

    python -m benchmarks.app.queue_wait

Two tabs through the app's own handlers and one ``ComputeQueue``, on the embedded SmolLM2-135M (CPU, float32): tab B
reads a short text; tab A starts reading a real Debian manual (the Policy Manual PDF, "Truncate to fit": the first
~4K tokens, a single 4,096-token forward on a CPU); ``--after`` seconds into A's read, B asks a question. Measured:
B's wait to reach the front (Ask → "Thinking…"), B's whole answer, and A's whole read. "Before" runs the same code with
``ComputeQueue.give_way`` returning at once (the read keeps the device). Writes docs/benchmarks/data/queue-wait.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import tempfile
import threading
import time
from pathlib import Path

from app.browser_state import BrowserState
from app.compute_queue import ComputeQueue
from app.handlers import Handlers
from engine import DocumentSession, OffloadPolicy
from engine.models.loader import load_model
from engine.read_time.costs import ReadCosts

from ..corpus import fetch_corpus
from ..records import run_stamp
from ..harness.layout import data_file

logger = logging.getLogger(__name__)

FACT = ("The lighthouse on Kerrow Point was built in 1871. Its keeper, Mara, trims the wick every evening. "
        "The secret launch code of the lighthouse is AMBER-7.\n")


def _text(html: object) -> str:
    return re.sub(r"<[^>]+>", "", str(html))


def one_run(handlers: Handlers, manual: str, short: str, after: float) -> dict:
    asker, reader = BrowserState(), BrowserState()
    handlers.choose_files([short], asker)
    list(handlers.read(False, asker))
    handlers.choose_files([manual], reader)
    read_events: list[tuple[float, str]] = []

    def read() -> None:
        for view in handlers.read(True, reader):
            read_events.append((time.monotonic(), _text(view.status)))

    thread = threading.Thread(target=read)
    thread.start()
    while not any("Reading" in text for _, text in read_events):
        time.sleep(0.01)
    read_started = next(at for at, text in read_events if "Reading" in text)
    time.sleep(max(read_started + after - time.monotonic(), 0.0))
    asked = time.monotonic()
    at_front = None
    for view in handlers.ask("What is the secret launch code of the lighthouse?", [], 16, 0.0, asker, True, False):
        if at_front is None and "Thinking" in _text(view.status):
            at_front = time.monotonic()
    answered = time.monotonic()
    thread.join()
    read_ended = read_events[-1][0]
    return {"read_tokens": reader.session.document_tokens, "asked_after_s": asked - read_started,
            "wait_for_turn_s": at_front - asked, "answer_s": answered - asked, "read_s": read_ended - read_started,
            "read_left_when_answered_s": read_ended - answered, "paused_lines": sum("Paused after" in t for _, t in read_events),
            "read_finished": read_events[-1][1][:80]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.app.queue_wait")
    p.add_argument("--corpus", default=".pytest_cache/d/debian-documents")
    p.add_argument("--after", type=float, default=10.0, help="seconds into the long read the question is asked")
    p.add_argument("--after-first", action="store_true", help="measure with giving way first, then without")
    p.add_argument("--out", default="docs/benchmarks")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    model, tokenizer = load_model(None, device="cpu", dtype="float32", weights="dense")
    manual = str(fetch_corpus(Path(args.corpus))["policy-pdf"])
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        short = Path(folder) / "lighthouse.txt"
        short.write_text(FACT * 3)
        for gives_way in (True, False) if args.after_first else (False, True):
            handlers = Handlers(lambda: DocumentSession(model, tokenizer, OffloadPolicy(), read_costs=ReadCosts(None)),
                                compute_queue=ComputeQueue())
            if not gives_way:  # before: the read keeps the device to its end
                handlers.app.queue.give_way = lambda *args, **kwargs: True
            row = {"gives_way": gives_way, **one_run(handlers, manual, str(short), args.after)}
            logger.info("%s", row)
            rows.append(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data_file(out, "queue-wait.json").write_text(json.dumps({"run": run_stamp("cpu"), "rows": rows}, indent=1))
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
