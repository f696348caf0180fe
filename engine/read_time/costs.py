"""What reads cost here, as measured: each read's chunk timings and the load probe around them, kept per model,
device, precision and KV policy (``ReadCosts``, a small JSON file across starts), and the load probe itself.

Each read records its chunks' timings: (position in the context, tokens, seconds). A chunk of ``q`` tokens at
position ``p`` does ``q`` tokens' worth of weight matmuls and attends ``q·p + q(q+1)/2`` (query, key) pairs
(``Chunk.features``; ``CostFit`` is the planner's FLOP model in those two terms).

The load is measured by a probe: a fixed matmul micro-benchmark of a fraction of a second, run just before (and
after a long) read and stored with its timings, and again when an estimate is made. What an estimate makes of
them is ``read_model``'s: the measured rate scaled to the recorded reads, and slowed as the probe's time to a
fixed power (the probe slows more than a read does, so α = 1 over-corrected: docs/benchmarks/estimate-error.md).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from .costs_file import FORMAT, KEEP, checked_file

logger = logging.getLogger(__name__)



def pairs(num_tokens: int) -> float:
    """(query, key) pairs a causal read of the first ``num_tokens`` tokens attends."""
    return num_tokens * (num_tokens + 1) / 2


@dataclass(frozen=True)
class Chunk:
    """One forward of a read: ``tokens`` tokens from ``position``, in ``seconds``."""

    position: int
    tokens: int
    seconds: float

    @property
    def features(self) -> tuple[float, float]:
        return float(self.tokens), pairs(self.position + self.tokens) - pairs(self.position)


@dataclass(frozen=True)
class CostFit:
    """Seconds (in probe units) = ``per_token · tokens + per_pair · pairs``."""

    per_token: float
    per_pair: float

    def cost(self, start: int, stop: int) -> float:
        """Reading tokens ``[start, stop)``: independent of how they are cut into chunks."""
        return self.per_token * (stop - start) + self.per_pair * (pairs(stop) - pairs(start))

    @classmethod
    def of(cls, points: list[tuple[float, float, float]]) -> CostFit | None:
        """Non-negative least squares of ``y ≈ a·x + b·z`` over ``(x, z, y)`` points (two unknowns: the best of the
        unconstrained solution, when non-negative, and the two one-term fits). None without a point."""
        if not points:
            return None
        sxx = sum(x * x for x, _, _ in points)
        szz = sum(z * z for _, z, _ in points)
        sxz = sum(x * z for x, z, _ in points)
        sxy = sum(x * y for x, _, y in points)
        szy = sum(z * y for _, z, y in points)
        candidates = [(0.0, 0.0)]
        if sxx > 0:
            candidates.append((max(sxy / sxx, 0.0), 0.0))
        if szz > 0:
            candidates.append((0.0, max(szy / szz, 0.0)))
        det = sxx * szz - sxz * sxz
        if det > 1e-12 * sxx * szz:
            a, b = (sxy * szz - szy * sxz) / det, (szy * sxx - sxy * sxz) / det
            if a >= 0 and b >= 0:
                candidates.append((a, b))

        def sse(ab: tuple[float, float]) -> float:
            return sum((ab[0] * x + ab[1] * z - y) ** 2 for x, z, y in points)

        return cls(*min(candidates, key=sse))


@dataclass(frozen=True)
class Probe:
    """One load probe: the mean seconds of its samples, and their spread (standard deviation / mean)."""

    seconds: float
    spread: float
    at: float  # time.monotonic() when taken


class LoadProbe:
    """A fixed matmul on the compute device, with torch's threads, timed: how busy the machine is right now.

    ``current()`` reuses a probe younger than ``max_age`` seconds, and while this process computes (``computing``:
    a read or an answer runs) the last one taken, so that our own work is not mistaken for other processes' load.
    What it returns is the median of the probes of the last ``window`` seconds: a read of minutes meets the load of
    minutes, not of the instant; their spread (and each probe's own) is the load's share of an estimate's range.
    """

    def __init__(self, device: torch.device | str = "cpu", *, size: int = 512, samples: int = 6,
                 max_age: float = 10.0, window: float = 300.0):
        self.device = torch.device(device)
        self.size, self.samples, self.max_age, self.window = size, samples, max_age, window
        self._lock = threading.Lock()
        self._history: list[Probe] = []
        self._computing = 0
        self._background = 0  # background work of ours (the reading-cost measurement): not a read, not others' load
        self._foreground = 0  # a visitor's plan being made (an upload): background work pauses meanwhile

    @property
    def flops(self) -> float:
        """FLOPs of one probe sample (four ``size``-square matmuls): over a probe's seconds, the matmul rate now."""
        return 4 * 2.0 * self.size**3

    @property
    def busy(self) -> bool:
        """A read or an answer computes now (what background work gives way to)."""
        with self._lock:
            return self._computing > 0

    @property
    def planning(self) -> bool:
        """A visitor's plan is being made now (``foreground``): background work pauses until it is shown."""
        with self._lock:
            return self._foreground > 0

    @contextmanager
    def foreground(self) -> Iterator[None]:
        """Inside the ``with`` a visitor waits for a plan (an upload being read, tokenized, planned): background work
        pauses between layers, so the plan does not share the cores with it."""
        with self._lock:
            self._foreground += 1
        try:
            yield
        finally:
            with self._lock:
                self._foreground -= 1

    @contextmanager
    def background(self) -> Iterator[None]:
        """Inside the ``with`` our own background work computes: ``current()`` reuses the last probe, as while a read
        computes, but ``busy`` stays false."""
        with self._lock:
            self._background += 1
        try:
            yield
        finally:
            with self._lock:
                self._background -= 1

    def begin_computing(self) -> None:
        with self._lock:
            self._computing += 1

    def end_computing(self) -> None:
        with self._lock:
            self._computing -= 1

    @contextmanager
    def computing(self) -> Iterator[None]:
        self.begin_computing()
        try:
            yield
        finally:
            self.end_computing()

    def current(self) -> Probe:
        """The load now: the recent probes' median (a new probe first unless the last is fresh or we compute)."""
        with self._lock:
            last = self._history[-1] if self._history else None
            busy = self._computing > 0 or self._background > 0
        if last is None or not (busy or time.monotonic() - last.at < self.max_age):
            self.measure()
        with self._lock:
            now = time.monotonic()
            recent = [p for p in self._history if now - p.at <= self.window] or self._history[-1:]
        seconds = statistics.median(p.seconds for p in recent)
        spread = max(max(p.spread for p in recent), (max(p.seconds for p in recent) - min(p.seconds for p in recent))
                     / (2 * seconds))
        return Probe(seconds, spread, recent[-1].at)

    def measure(self) -> Probe:
        """A new probe (about 0.1-0.3 s on a 2-core CPU, idle; proportionally longer on a busy one)."""
        a = torch.randn(self.size, self.size, device=self.device)
        b = torch.randn(self.size, self.size, device=self.device)
        times = []
        with torch.inference_mode():
            torch.mm(a, b)  # warm-up
            for _ in range(self.samples):
                _synchronize(self.device)
                started = time.perf_counter()
                for _ in range(4):
                    torch.mm(a, b)
                _synchronize(self.device)
                times.append(time.perf_counter() - started)
        mean = statistics.fmean(times)
        probe = Probe(mean, statistics.pstdev(times) / mean, time.monotonic())
        with self._lock:
            self._history = [p for p in self._history if probe.at - p.at <= self.window][-63:] + [probe]
        return probe


class ReadTiming:
    """One read's chunk timings and the load probes around them: a probe before the read, another between chunks
    once ``reprobe_every`` seconds were read since the last, and one after a long read; each chunk is kept with the
    mean of the probes before and after its stretch."""

    def __init__(self, probe: LoadProbe, reprobe_every: float = 20.0):
        self.probe, self.reprobe_every = probe, reprobe_every
        self.chunks: list[Chunk] = []
        self.stretches: list[int] = []  # the probe before each chunk (an index into ``probes``)
        self.probes = [probe.current().seconds]
        self.since_probe = 0.0

    def add(self, chunk: Chunk) -> None:
        self.chunks.append(chunk)
        self.stretches.append(len(self.probes) - 1)
        self.since_probe += chunk.seconds

    def between_chunks(self) -> None:
        if self.since_probe >= self.reprobe_every:
            self.probes.append(self.probe.measure().seconds)
            self.since_probe = 0.0

    def record(self, costs: ReadCosts, key: str) -> None:
        """Keeps the read (a cancelled one's chunks too) when it read for at least half a second."""
        if sum(c.seconds for c in self.chunks) < 0.5:
            return
        if self.since_probe >= self.reprobe_every / 2:
            self.probes.append(self.probe.measure().seconds)
        probes = [(self.probes[i] + self.probes[min(i + 1, len(self.probes) - 1)]) / 2 for i in self.stretches]
        costs.record(key, self.chunks, probes)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_PROBES: dict[str, LoadProbe] = {}


def load_probe(device: torch.device) -> LoadProbe:
    """One probe per device for the whole process (every tab's session shares it)."""
    return _PROBES.setdefault(str(device), LoadProbe(device))


class ReadCosts:
    """The chunk timings of completed reads, per model, device, precision and KV policy, kept in a small JSON file
    so later starts estimate from them. Each read: ``{"at": time, "chunks": [[position, tokens, seconds, probe
    seconds], ...]}``."""

    def __init__(self, path: Path | None):
        self.path = path
        self._lock = threading.Lock()
        self._records: dict[str, list[dict]] | None = None
        self._rates: dict[str, dict] = {}  # measured first-read rates (``engine.read_time.read_rate``), per rate key

    def record(self, key: str, chunks: list[Chunk], probe_seconds: float | list[float]) -> None:
        """A read's chunks, timed while the load probe took ``probe_seconds`` (one for the read, or one per chunk)."""
        probes = probe_seconds if isinstance(probe_seconds, list) else [probe_seconds] * len(chunks)
        kept = [(c, p) for c, p in zip(chunks, probes, strict=True) if c.tokens > 0 and c.seconds > 0 and p > 0]
        if not kept:
            return
        with self._lock:
            records = self._load()
            records.setdefault(key, []).append({"at": time.time(),
                                                "chunks": [[c.position, c.tokens, c.seconds, p] for c, p in kept]})
            records[key] = records[key][-KEEP:]
            self._save(records)

    def rate(self, key: str) -> dict | None:
        """The first-read rate an earlier start measured for ``key`` (``engine.read_time.read_rate.ReadRate`` as a dict)."""
        with self._lock:
            self._load()
            return self._rates.get(key)

    def keep_rate(self, key: str, rate: dict) -> None:
        with self._lock:
            records = self._load()
            self._rates[key] = rate
            self._save(records)

    def reads(self, key: str) -> list[list[tuple[float, float, float]]]:
        """Each kept read's points ``(tokens, pairs, seconds / probe seconds)``."""
        return [[(*c.features, c.seconds / probe) for c, probe in read] for read in self.timed_reads(key)]

    def timed_reads(self, key: str) -> list[list[tuple[Chunk, float]]]:
        """Each kept read's chunks, each with the load probe's seconds around it (what ``read_model`` scales by)."""
        with self._lock:
            found = list(self._load().get(key, []))
        return [[(Chunk(int(p), int(q), s), probe) for p, q, s, probe in read["chunks"]] for read in found]

    def _load(self) -> dict:
        if self._records is None:
            self._records = {}
            if self.path is not None:
                try:
                    self._records, self._rates = checked_file(self.path)
                except FileNotFoundError:
                    pass
                except (OSError, ValueError, RecursionError) as error:  # estimates only: start from no reads
                    logger.warning("ignoring the read timings in %s (%s): estimates start from no measurements",
                                   self.path, str(error)[:200])
        return self._records

    def _save(self, records: dict) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            scratch = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            scratch.write_text(json.dumps({"format": FORMAT, "reads": records, "rates": self._rates}))
            os.replace(scratch, self.path)
        except OSError as error:  # estimates only: never fail a read over them
            logger.warning("could not keep the read's timings in %s: %s", self.path, error)


_SHARED: dict[Path, ReadCosts] = {}


def shared_read_costs(path: Path) -> ReadCosts:
    """One ``ReadCosts`` per file for the whole process (every tab's session records into it)."""
    return _SHARED.setdefault(path, ReadCosts(path))
