"""Pacing a chunked prefill: how many tokens each forward reads, and progress reports with an ETA.

``DocumentSession.prefill`` drives the forwards; this module decides their size and what to report.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .planning.memory import ModelShape, estimate_prefill_seconds
from .reports import PrefillProgress

logger = logging.getLogger(__name__)

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


# -- honest estimates: learned from real reads ------------------------------------------------------------------
_KEEP = 24  # records kept per model, device and precision
_NEAREST = 5  # records an estimate is made from: the reads of the most similar length
_FIRST_READ_SPREAD = 0.5  # before any read, the micro-benchmark's estimate is shown as -50% / +50%
_MIN_SPREAD = 0.15


class ReadRates:
    """What reads really cost here: each completed read's rate, in units of prefill work (``prefill_work``) per
    second, per model, device and precision, kept in a small JSON file so that later starts estimate from them.

    The launch-time micro-benchmark (``telemetry.measured_flop_rate``) is used only before the first read: on a
    machine whose load changes it was 2-3x off, while a read of the same length a minute ago is the best witness.
    """

    def __init__(self, path: Path | None):
        self.path = path
        self._lock = threading.Lock()
        self._records: dict[str, list[list[float]]] | None = None

    def record(self, key: str, num_tokens: int, work: float, seconds: float, share: float = 1.0) -> None:
        """A completed read of ``num_tokens`` tokens (``work`` units) that took ``seconds`` while it got ``share`` of
        the CPU time its threads asked for (``cpu_share``; 1 on a GPU): kept as the rate it would have had alone."""
        if seconds <= 0 or work <= 0:
            return
        with self._lock:
            records = self._load()
            records.setdefault(key, []).append([float(num_tokens), work / seconds / max(share, 0.05), time.time()])
            records[key] = records[key][-_KEEP:]
            self._save(records)

    def rates(self, key: str, num_tokens: int) -> list[float]:
        """The learned rates of the reads most similar in length to ``num_tokens`` (newest first among equals)."""
        with self._lock:
            found = list(self._load().get(key, []))
        found.sort(key=lambda r: (abs(math.log(max(r[0], 1.0) / max(num_tokens, 1))), -r[2]))
        return [rate for _, rate, _ in found[:_NEAREST]]

    def _load(self) -> dict:
        if self._records is None:
            self._records = {}
            if self.path is not None:
                try:
                    self._records = json.loads(self.path.read_text())
                except (OSError, ValueError):
                    self._records = {}
        return self._records

    def _save(self, records: dict) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            scratch = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            scratch.write_text(json.dumps(records))
            os.replace(scratch, self.path)
        except OSError as error:  # estimates only: never fail a read over them
            logger.warning("could not keep the read's speed in %s: %s", self.path, error)


def estimate_range(work: float, learned: list[float], benchmark_rate: float,
                   share: float = 1.0) -> tuple[float, float, float]:
    """(low, likely, high) seconds for ``work`` units at ``share`` of the CPU (``expected_share``): from the learned
    rates (their median, and their spread, at least ±15%), else from the micro-benchmark's rate with ±50%."""
    if not learned:
        likely = work / benchmark_rate
        return likely * (1 - _FIRST_READ_SPREAD), likely, likely * (1 + _FIRST_READ_SPREAD)
    learned = [rate * max(share, 0.05) for rate in learned]
    likely = work / statistics.median(learned)
    low, high = work / max(learned), work / min(learned)
    return min(low, likely * (1 - _MIN_SPREAD)), likely, max(high, likely * (1 + _MIN_SPREAD))


def cpu_share(cpu_seconds: float, seconds: float, num_threads: int) -> float:
    """The share of the CPU time a read's ``num_threads`` threads asked for that they got (``cpu_seconds`` of
    process time in ``seconds``): about 1 on an idle machine, 0.3 when others keep the cores busy."""
    return min(max(cpu_seconds / max(seconds * num_threads, 1e-9), 0.05), 1.0)


_LOAD_MINUTE = 60.0  # the 1-minute load average's time constant
_own_reads: list[tuple[float, float, int]] = []  # (ended at, seconds, threads) of this process's recent reads


def note_own_read(seconds: float, num_threads: int) -> None:
    """A read of this process just ended: the load average still counts its threads for a while."""
    _own_reads.append((time.monotonic(), seconds, num_threads))
    del _own_reads[:-8]


def expected_share(num_threads: int) -> float:
    """The share a read starting now is likely to get: the cores over the runnable threads, i.e. other processes'
    (the last minute's load less what this process's own recent reads still add to it) plus the read's own."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0
    now = time.monotonic()
    # The 1-minute average rises as 1 - e^(-t/60) while a read runs and decays as e^(-t/60) after it.
    own = sum(threads * (1 - math.exp(-seconds / _LOAD_MINUTE)) * math.exp(-(now - ended) / _LOAD_MINUTE)
              for ended, seconds, threads in _own_reads)
    others = max(load - own, 0.0)
    return min((os.cpu_count() or 1) / max(others + num_threads, 1e-9), 1.0)


_SHARED: dict[Path, ReadRates] = {}


def shared_read_rates(path: Path) -> ReadRates:
    """One ``ReadRates`` per file for the whole process (every tab's session records into it)."""
    return _SHARED.setdefault(path, ReadRates(path))
