"""Run a callback-reporting job (like ``DocumentSession.prefill``) in a worker thread and iterate
over its reports, so a Gradio generator handler can yield a UI update for each one.

The engine reports progress through a callback; a generator cannot yield from inside a callback,
hence the thread and the queue between them.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

_FINISHED = object()


def iterate_reports(work: Callable[[Callable[[T], None]], Any], *, abandon: Callable[[], None],
                    min_interval: float = 0.2, name: str = "worker") -> Iterator[T]:
    """Runs ``work(report)`` in a thread and yields what it reports, newest only.

    At most one report per ``min_interval`` seconds is yielded (older ones queued meanwhile are
    skipped), but the last report is always yielded. An exception raised by ``work`` is re-raised
    here, in the consumer's thread, after the last report.

    If the consumer stops iterating early (the browser went away and Gradio closed the
    generator), ``abandon()`` is called to ask the job to stop and the thread is joined, so the
    job never outlives its event and two jobs never share the compute device.
    """
    reports: queue.Queue = queue.Queue()
    outcome: dict[str, BaseException] = {}

    def target() -> None:
        try:
            work(reports.put)
        except BaseException as exc:  # handed to the consumer, which decides what is an error
            outcome["error"] = exc
        finally:
            reports.put(_FINISHED)

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    try:
        pending, last_yield = None, float("-inf")  # pending: newest report not yet yielded
        while True:
            timeout = None if pending is None else max(0.0, last_yield + min_interval - time.monotonic())
            try:
                item = reports.get(timeout=timeout)
            except queue.Empty:  # the interval has passed with no newer report
                item = None
            if item is _FINISHED:
                if pending is not None:
                    yield pending
                break
            if item is not None:
                pending = item
            if time.monotonic() - last_yield >= min_interval:
                last_yield = time.monotonic()
                pending, report = None, pending
                yield report
    finally:
        if thread.is_alive():
            abandon()
            thread.join()
    if "error" in outcome:
        raise outcome["error"]
