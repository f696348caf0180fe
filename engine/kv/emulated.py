"""Emulated CUDA streams on a CPU: side streams as FIFO worker threads with random delays, plus the checker.

What a CUDA stream promises, and what this backend therefore does:

- a side stream runs its operations in issue order, some time after they were issued: here a worker thread
  per stream runs them after random per-operation delays and occasional long stalls (seeded), and a copy
  reads its source when it *runs*, so a reader that did not wait sees stale or half-written data;
- the compute stream is the caller's thread: its operations run at once (a GPU kernel would run later, which
  delays cannot show; the happens-before checker does);
- an event completes when its stream reaches it; a wait captures the event's generation current at the call
  (recording it again later does not move what was waited for); waiting on a never-recorded event is a no-op;
  ``stream.wait_event`` makes only that stream wait (the compute stream: the caller's thread blocks, so that
  its operations run after it, but the *thread* learns nothing: a host read still needs ``synchronize``);
- every copy, event and declared access is told to ``happens_before.HappensBefore``, which raises ``RaceError`` for
  a conflicting pair of accesses that nothing orders;
- pins are charged to a budget of the backend's own (one backend stands for one process): past
  ``HEADINFER_PIN_LIMIT`` a pin is refused, and every pin after it too, as under Windows' display driver.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future

import torch

from .happens_before import HappensBefore
from .pin_budget import PinBudget, limit_from_env

logger = logging.getLogger(__name__)

STALL_PROBABILITY = 0.02
STALL_SECONDS = (0.002, 0.012)
DELAY_SECONDS = 0.0004


class EmulatedStream:
    """A stream: a FIFO worker thread, or (``compute``) the thread that issues to it."""

    def __init__(self, backend: EmulatedStreams, name: str, compute: bool = False):
        self.name, self.is_compute, self._backend = name, compute, backend
        self._error: BaseException | None = None
        if compute:
            return
        self._queue: collections.deque = collections.deque()
        self._wake = threading.Condition()
        self._random = random.Random(f"{backend.seed}:{name}")
        self._thread = threading.Thread(target=self._loop, name=f"emulated-{name}", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"<stream {self.name}>"

    # -- the worker ------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._queue:
                    self._wake.wait()
                op = self._queue[0]
            if op is None:
                return
            self._delay()
            try:
                if self._error is None or getattr(op, "always", False):
                    op()
            except BaseException as error:  # reported by the next wait on this stream
                logger.error("emulated stream %s: operation failed: %r", self.name, error)
                self._error = self._error or error
            with self._wake:
                self._queue.popleft()
                self._wake.notify_all()

    def _delay(self) -> None:
        r = self._random.random()
        if r < STALL_PROBABILITY:
            time.sleep(self._random.uniform(*STALL_SECONDS))
        elif r < 0.5:
            time.sleep(self._random.uniform(0.0, DELAY_SECONDS))

    def enqueue(self, op: Callable[[], None]) -> None:
        """Runs ``op`` now (compute) or on the worker after everything issued before it."""
        if self.is_compute:
            op()
            return
        with self._wake:
            self._queue.append(op)
            self._wake.notify_all()

    def _drain(self) -> None:
        if self.is_compute:
            return
        done = threading.Event()

        def marker():
            done.set()

        marker.always = True
        self.enqueue(marker)
        done.wait()

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"an operation on emulated stream {self.name} failed") from error

    # -- the CUDA API the engine uses -----------------------------------------------------------------
    def wait_event(self, event: EmulatedEvent) -> None:
        generation, snapshot = event.generation, event.snapshot
        if generation == 0:
            return  # never recorded: a no-op, as in CUDA
        checker = self._backend.checker
        checker.issue(self)
        checker.join(self, snapshot)
        if self.is_compute:
            event.wait_for(generation)  # the caller's thread *is* this stream: it blocks (and learns nothing)
            return

        def wait():
            event.wait_for(generation)

        wait.always = True
        self.enqueue(wait)

    def synchronize(self) -> None:
        checker = self._backend.checker
        checker.issue(self)
        snapshot = checker.snapshot(self)
        self._drain()
        checker.join(checker.thread(), snapshot)
        self._raise_error()


class EmulatedEvent:
    def __init__(self, backend: EmulatedStreams):
        self._backend = backend
        self.generation = 0  # records issued
        self._done = 0  # records the stream has reached
        self.snapshot: dict | None = None  # the recording stream's clock at the newest record
        self._cond = threading.Condition()

    def record(self, stream: EmulatedStream | None = None) -> None:
        stream = stream or self._backend.current()
        checker = self._backend.checker
        checker.issue(stream)
        self.snapshot = checker.snapshot(stream)
        checker.tick(stream)  # what the stream does next is after this record
        self.generation += 1
        generation = self.generation

        def reached():
            with self._cond:
                self._done = max(self._done, generation)
                self._cond.notify_all()

        reached.always = True
        stream.enqueue(reached)

    def wait_for(self, generation: int) -> None:
        with self._cond:
            while self._done < generation:
                self._cond.wait()

    def synchronize(self) -> None:
        generation, snapshot = self.generation, self.snapshot
        if generation == 0:
            return
        self.wait_for(generation)
        self._backend.checker.join(self._backend.checker.thread(), snapshot)

    def query(self) -> bool:
        return self._done >= self.generation


class EmulatedStreams:
    """The emulated backend of one cache: its side streams, the compute stream, and the checker."""

    name = "emulated"
    is_async = True

    def __init__(self, seed: int = 0, checker: HappensBefore | None = None, pin_limit: int | None = None):
        self.seed = seed
        self.checker = checker or HappensBefore()
        self.pin_budget = PinBudget(pin_limit if pin_limit is not None else limit_from_env(), sticky=True)
        self._random = random.Random(f"{seed}:threads")
        self._compute = EmulatedStream(self, "compute", compute=True)
        self._local = threading.local()
        self._streams: list[EmulatedStream] = []
        logger.info("emulated streams (seed %d) with the happens-before checker", seed)

    def new_stream(self, name: str) -> EmulatedStream:
        stream = EmulatedStream(self, name)
        self._streams.append(stream)
        return stream

    def event(self, blocking: bool = False) -> EmulatedEvent:
        return EmulatedEvent(self)

    def current(self) -> EmulatedStream:
        return getattr(self._local, "stream", None) or self._compute

    @contextlib.contextmanager
    def use(self, stream: EmulatedStream):
        previous = getattr(self._local, "stream", None)
        self._local.stream = stream
        try:
            yield
        finally:
            self._local.stream = previous

    def copy(self, dst: torch.Tensor, src: torch.Tensor, what: str = "") -> None:
        stream = self.current()
        self.checker.issue(stream)
        self.checker.access(stream, src, False, f"{what or 'a copy'}'s source")
        self.checker.access(stream, dst, True, f"{what or 'a copy'}'s target")

        def run():
            with torch.inference_mode():  # (grad mode is per thread; in-place writes are allowed in it)
                dst.copy_(src)

        stream.enqueue(run)

    def copy_many(self, dsts: list[torch.Tensor], srcs: list[torch.Tensor], what: str = "") -> None:
        stream = self.current()
        self.checker.issue(stream)
        for dst, src in zip(dsts, srcs, strict=True):
            self.checker.access(stream, src, False, f"{what or 'a copy'}'s source")
            self.checker.access(stream, dst, True, f"{what or 'a copy'}'s target")

        def run():
            with torch.inference_mode():
                for dst, src in zip(dsts, srcs):
                    dst.copy_(src)

        stream.enqueue(run)

    def pinned(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """Plain memory standing for page-locked memory, charged to the budget (refused past it, stickily)."""
        self.pin_budget.check(torch.Size(shape).numel() * dtype.itemsize)
        with torch.inference_mode(False):
            return self.pin_budget.take(torch.empty(shape, dtype=dtype))

    # -- declared accesses -------------------------------------------------------------------------------
    def read(self, tensor: torch.Tensor, what: str = "") -> None:
        stream = self.current()
        self.checker.issue(stream)
        self.checker.access(stream, tensor, False, what)

    def write(self, tensor: torch.Tensor, what: str = "") -> None:
        stream = self.current()
        self.checker.issue(stream)
        self.checker.access(stream, tensor, True, what)

    def host_read(self, tensor: torch.Tensor, what: str = "") -> None:
        self.checker.access(self.checker.thread(), tensor, False, what)

    def host_write(self, tensor: torch.Tensor, what: str = "") -> None:
        self.checker.access(self.checker.thread(), tensor, True, what)

    def forget(self, tensor: torch.Tensor) -> None:
        """The tensor's memory is about to be freed or handed to another use: no copy may still touch it."""
        self.checker.access(self.checker.thread(), tensor, True, "memory being freed")
        self.checker.forget(tensor)

    # -- worker threads ---------------------------------------------------------------------------------
    def submit(self, executor: Executor, fn: Callable, *args) -> Future:
        """``executor.submit(fn, *args)``; the task starts knowing what this thread knows."""
        checker = self.checker
        start = checker.snapshot(checker.thread())
        end: dict = {}

        delay = self._random.random() < 0.5 and self._random.uniform(0.0, 0.003)

        def task():
            checker.join(checker.thread(), start)
            if delay:
                time.sleep(delay)  # a worker thread the OS starts late: a caller that did not wait sees it
            try:
                return fn(*args)
            finally:
                end["clock"] = checker.snapshot(checker.thread())

        future = executor.submit(task)
        future.hb_end = end
        return future

    def joined(self, future: Future) -> None:
        """The caller has waited for ``future``: it learns what the task knew at its end. Claiming so for a task
        that has not finished is a missing wait: reported as a race."""
        if not future.done():
            self.checker.report_missing_wait("a worker's job joined before it finished")
            return
        self.checker.join(self.checker.thread(), getattr(future, "hb_end", {}).get("clock"))

    def close(self) -> None:
        for stream in self._streams:
            stream._drain()
            with stream._wake:
                stream._queue.append(None)
                stream._wake.notify_all()
        self._streams = []
