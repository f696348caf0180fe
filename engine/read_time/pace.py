"""Pacing a chunked prefill: how many tokens each forward reads, and progress reports with an ETA.

``DocumentSession.prefill`` drives the forwards; this module decides their size and what to report.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..planning.shape import ModelShape
from ..reports import PrefillProgress
from .flops import estimate_prefill_seconds

# CPU prefill forwards: at most ~this many (query, key) pairs per attention call, at least this many tokens.
_CPU_ATTENTION_PAIRS = 2048 * 8192
_CPU_STEP_FLOOR = 64
_PROGRESS_EVERY = 1.0  # seconds between progress reports from inside a long forward


def prefill_step(chunk: int, device_type: str, done: int) -> int:
    """Tokens per forward: the chunk size, but on a CPU no more than keeps one layer's attention (queries
    x keys) short, so a cancel lands within about a second at any context length. Each forward streams
    the offloaded K/V over the GPU link, so with CUDA the chunk stays whole."""
    if device_type == "cuda":
        return chunk
    return max(min(chunk, _CPU_STEP_FLOOR), min(chunk, _CPU_ATTENTION_PAIRS // (done + chunk)))


def prefill_work(shape: ModelShape, start: int, stop: int) -> float:
    """Prefill work of tokens [start, stop) (the planner's FLOP model, in seconds at a unit rate)."""
    return estimate_prefill_seconds(shape, stop, 1.0) - estimate_prefill_seconds(shape, start, 1.0)


class PrefillClock:
    """The progress of one ``prefill`` call, from ``start_tokens`` (where an earlier one stopped) to
    ``total_tokens``: reports after each forward, and about every second from between a long one's layers."""

    def __init__(self, shape: ModelShape, start_tokens: int, total_tokens: int,
                 on_progress: Callable[[PrefillProgress], None] | None):
        self.shape, self.start_tokens, self.total_tokens = shape, start_tokens, total_tokens
        self.on_progress = on_progress
        self.started = time.perf_counter()
        self.done, self.size, self.reported = start_tokens, 0, self.started  # the forward under way

    def report(self, done: float) -> PrefillProgress:
        elapsed = time.perf_counter() - self.started
        # The rest at the rate so far, in units of work: later tokens attend to more keys than earlier ones.
        work_done = prefill_work(self.shape, self.start_tokens, done)
        remaining = prefill_work(self.shape, done, self.total_tokens) * elapsed / work_done if work_done > 0 else None
        return PrefillProgress(int(done), self.total_tokens, (done - self.start_tokens) / max(elapsed, 1e-9),
                               elapsed, remaining)

    def paused(self, seconds: float) -> None:
        """The read gave the device to others for ``seconds`` between forwards: not reading time."""
        self.started += seconds

    def begin_forward(self, done: int, size: int) -> None:
        self.done, self.size = done, size

    def within_forward(self, layer: int, num_layers: int) -> None:
        """A layer callback: a long chunk still reports every ~second, from between its layers."""
        if self.on_progress is not None and time.perf_counter() - self.reported >= _PROGRESS_EVERY:
            self.reported = time.perf_counter()
            self.on_progress(self.report(self.done + self.size * layer / num_layers))

    def end_forward(self, done: int) -> PrefillProgress:
        """Reports ``done`` tokens read after a forward; returns that progress."""
        progress = self.report(done)
        self.reported = time.perf_counter()
        if self.on_progress is not None:
            self.on_progress(progress)
        return progress


class CheckpointPace:
    """When a read checkpoints (``store/checkpoint.py``): every ``every_seconds`` or ``every_chunks`` forwards,
    whichever comes first, counted from the last checkpoint that started."""

    def __init__(self, every_seconds: float, every_chunks: int):
        self.every_seconds, self.every_chunks = every_seconds, every_chunks
        self._since, self._chunks = time.perf_counter(), 0

    def after_forward(self) -> bool:
        """Counts a forward; True when a checkpoint is due."""
        self._chunks += 1
        return self._chunks >= self.every_chunks or time.perf_counter() - self._since >= self.every_seconds

    def started(self) -> None:
        self._since, self._chunks = time.perf_counter(), 0
