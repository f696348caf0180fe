"""The first read's cost on this machine, before any read: measured once per model, machine, torch version and
weights mode, in the background, never in the way of a start, a plan or a read.

A read's time is priced as ``forwards · c + tokens · a + pairs · b``: a fixed cost per forward (per layer and per
operation overheads, most of a short forward on a busy CPU), the tokens' linear work, and causal attention's
(query, key) pairs. All three are measured from forwards of ``READ_RATE_TOKENS`` run as a read runs them (the
three unknowns from three sizes, non-negative least squares, the pair term never below its share of the FLOPs),
each size timed twice and the faster kept.

Why three measured terms, not the planner's FLOP model scaled (the earlier cost model): that model tied the
attention term to the linear one by their FLOP counts and two short forwards (128 and 512 tokens) priced the rest;
their slope is the linear term alone and carried the larger size's first-use costs (allocator and kernel set-up),
a surplus that, priced as work, grew with the document: the longer the document, the longer the estimate
(``docs/benchmarks/estimate-error.md``, its tables and Notes from the code). A forward of 1,536 tokens
(attention a fifth of its FLOPs) sees the quadratic term, and the faster of two runs of each size drops the
first-use costs and the worst of a busy machine's spikes.

On a first start the measurement runs on a background thread after the app is ready; until it lands the plan
shows a provisional estimate (``ReadEstimate.provisional``). It gives way to reads by stopping, not by a lower CPU
priority: a read or an answer that starts meanwhile stops it between layers (within about a layer's time; their
own chunk timings then teach the estimate, ``costs``), and a later plan starts it again while no read has been
recorded. A niced thread would time a busy machine's forwards slower than a read at the app's priority runs them
(on 2 cores shared with other jobs, a nice-10 thread gets a fraction of a core), and the estimate with them.
What it measured is kept in the read-cost record's file, so a second start measures nothing.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass
from itertools import combinations

import torch

from ..errors import ForwardInterrupted
from ..interrupt import interruptible, layer_callbacks
from ..planning.machine import synchronize
from ..planning.machine_rates import cpu_model
from .costs import CostFit, LoadProbe, ReadCosts, pairs

logger = logging.getLogger(__name__)

READ_RATE_TOKENS = (128, 512, 1536)  # three sizes for three unknowns; the largest sees attention's quadratic term
_TIMINGS_PER_SIZE = 2  # the faster of two: a size's first forward pays first-use costs, a busy machine spikes
# On a CPU a FLOP of attention costs this many FLOPs of the weight matmuls: fitted (a shared factor, each table its own
# per-forward and per-token cost) to the two tables of forwards timed in a row in estimate-error.md (2026-11-26, 128
# to 4,096 tokens, load 2-8 and ~20); scored on first reads it was not fitted on (estimate-accuracy.md).
CPU_ATTENTION_COST = 1.8
_PROVISIONAL_SPREAD = 3.0  # before the measurement lands: the probe's FLOP rate's estimate, /3 to x3
# A read's FLOP rate over the load probe's: 2.05 = the 3/4 assumed before times the geometric mean of what its
# provisional estimates came out over 12 first reads of 1.5K-6K tokens (x1.75-4.32, load average 4.5-17; the probe's
# small matmuls run below a read's rate and slow more under load: ``estimate-error.md``).
_PROBE_EFFICIENCY = 2.05


class ReadEstimate(tuple):
    """``(low, likely, high)`` seconds, unpacked as a tuple; ``provisional`` while this machine's reading cost is
    still being measured (the plan says so, and its range is wide)."""

    provisional: bool

    def __new__(cls, low: float, likely: float, high: float, provisional: bool = False):
        estimate = super().__new__(cls, (low, likely, high))
        estimate.provisional = provisional
        return estimate


@dataclass(frozen=True)
class ReadRate:
    """Seconds of a read = ``per_forward · forwards + per_token · tokens + per_pair · pairs``, measured while the
    load probe took ``probe_seconds``."""

    per_forward: float
    per_token: float
    per_pair: float
    probe_seconds: float

    def seconds(self, num_forwards: int, start: int, stop: int) -> float:
        """Reading tokens ``[start, stop)`` in ``num_forwards`` forwards."""
        return (self.per_forward * num_forwards + self.per_token * (stop - start)
                + self.per_pair * (pairs(stop) - pairs(start)))

    @classmethod
    def from_json(cls, value) -> ReadRate | None:
        try:
            rate = cls(**{name: float(value[name]) for name in cls.__dataclass_fields__})
        except (TypeError, KeyError, ValueError):
            return None
        fields = asdict(rate).values()
        return rate if all(math.isfinite(v) and v >= 0 for v in fields) and rate.probe_seconds > 0 else None


def fit_forwards(points: list[tuple[int, float]], probe_seconds: float, pair_floor: float = 0.0,
                 tied: bool = False) -> ReadRate | None:
    """Non-negative least squares of ``seconds ≈ c + a·tokens + b·pairs(tokens)`` over forwards from position 0
    (``(tokens, seconds)``), with ``b ≥ pair_floor · a``: the best of every subset of the three terms (``c``, ``a``
    and ``b``'s excess over its floor) whose unconstrained solution is non-negative. None without a usable point.

    ``pair_floor``: seconds per pair per second per token at the least, the planner's FLOP model's ratio of a pair's
    FLOPs to a token's (``attention_floor``). Attention's FLOPs run no faster than the weight matmuls' (small per-head
    matmuls and a softmax against large GEMMs, on a CPU as on a GPU), so attention costs at least its FLOP share.
    Without the floor the pair term rested on the 1,536-token forward alone: on a busy machine that forward ran fast,
    the fit dropped the term and priced a long read far short (docs/benchmarks/estimate-error.md).

    ``tied``: ``b = pair_floor · a`` exactly, two unknowns from the three sizes (a CPU's, ``pair_cost_ratio``): three
    points fitted exactly by three terms carry each forward's noise into the terms (``estimate-accuracy.md``)."""
    rows = [((1.0, float(n) + pair_floor * pairs(n), pairs(n)), s) for n, s in points if n > 0 and s > 0]
    if not rows:
        return None
    best, best_error = None, math.inf
    for size in (1, 2) if tied else (1, 2, 3):
        for terms in combinations(range(2 if tied else 3), size):
            solved = _least_squares([[x[t] for t in terms] for x, _ in rows], [y for _, y in rows])
            if solved is None or any(v < 0 for v in solved):
                continue
            coefficients = [0.0, 0.0, 0.0]
            for t, v in zip(terms, solved, strict=True):
                coefficients[t] = v
            error = sum((sum(c * v for c, v in zip(coefficients, x, strict=True)) - y) ** 2 for x, y in rows)
            if error < best_error * (1 - 1e-9):  # a tie keeps the simpler model found first
                best, best_error = coefficients, error
    if best is None:
        return None
    per_forward, per_token, excess = best
    return ReadRate(per_forward, per_token, excess + pair_floor * per_token, probe_seconds)


def _least_squares(a: list[list[float]], y: list[float]) -> list[float] | None:
    """Solves the normal equations of ``a·x ≈ y`` (a few columns, scaled first); None when singular."""
    n = len(a[0])
    scale = [max(abs(row[j]) for row in a) or 1.0 for j in range(n)]
    a = [[row[j] / scale[j] for j in range(n)] for row in a]
    m = [[sum(row[i] * row[j] for row in a) for j in range(n)] + [sum(row[i] * t for row, t in zip(a, y))]
         for i in range(n)]
    for col in range(n):  # Gauss-Jordan with partial pivoting
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                factor = m[r][col] / m[col][col]
                m[r] = [v - factor * w for v, w in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] / scale[i] for i in range(n)]


def measure_read_rate(model, vocab_size: int, forward: Callable[[torch.Tensor], None], probe: Callable[[], float],
                      should_stop: Callable[[], bool] = lambda: False,
                      give_way: Callable[[], None] | None = None, pair_floor: float = 0.0,
                      tied: bool = False) -> ReadRate | None:
    """Times forwards of ``READ_RATE_TOKENS`` as ``forward(ids)`` runs them (a read's), each ``_TIMINGS_PER_SIZE``
    times, the faster kept, after a short warm-up, with ``probe()`` (the load probe's seconds) before and after; fits
    them (``fit_forwards``, the pair term at least ``pair_floor`` times the token term, or exactly that ``tied``). None when ``should_stop()`` turned true (checked between forwards and between layers).
    ``give_way()`` runs between layers and may block (a plan being made): that time is not counted."""
    device = next(model.parameters()).device
    ids = torch.randint(0, vocab_size, (1, max(READ_RATE_TOKENS)), device=device)  # [1, N]
    before = probe()
    points, paused = [], [0.0]

    def between_layers(layer: int, num_layers: int) -> None:
        if give_way is not None:
            started = time.perf_counter()
            give_way()
            paused[0] += time.perf_counter() - started

    try:
        with torch.inference_mode(), interruptible(model, should_stop), layer_callbacks(model, between_layers):
            forward(ids[:, :8])  # warm-up: first-use costs of the model (a native kernel compiles on a clean cache)
            for n in READ_RATE_TOKENS:
                best = math.inf
                for _ in range(_TIMINGS_PER_SIZE):
                    if should_stop():
                        return None
                    synchronize(device)  # (on a GPU a forward only launches kernels: the clock must see them run)
                    started, paused[0] = time.perf_counter(), 0.0
                    forward(ids[:, :n])
                    synchronize(device)
                    best = min(best, time.perf_counter() - started - paused[0])
                points.append((n, best))
    except ForwardInterrupted:
        return None
    rate = fit_forwards(points, (before + probe()) / 2, pair_floor, tied)
    if rate is not None:
        logger.info("read rate: %.3f s per forward + %.3g s per token + %.3g s per (query, key) pair (forwards %s; "
                    "probe %.0f ms)", rate.per_forward, rate.per_token, rate.per_pair,
                    ", ".join(f"{n} tokens {s:.2f} s" for n, s in points), 1000 * rate.probe_seconds)
    return rate


def attention_floor(flop_model: CostFit) -> float:
    """``fit_forwards``'s ``pair_floor`` for a model: its FLOP model's seconds per (query, key) pair over its seconds
    per token (at any one FLOP rate: their ratio of FLOPs)."""
    return flop_model.per_pair / flop_model.per_token if flop_model.per_token > 0 else 0.0


def pair_cost_ratio(flop_model: CostFit) -> float:
    """A CPU's seconds per (query, key) pair over its seconds per token (``fit_forwards(tied=True)``): the FLOP
    model's ratio times ``CPU_ATTENTION_COST``."""
    return CPU_ATTENTION_COST * attention_floor(flop_model)


def rate_key(model, cost_key: str, weights: str) -> str:
    """What a measured rate holds for: the read-cost key (model, device, dtype, KV policy), this machine (its CPU or
    GPU), the torch version and how the weights are held (``weights``: dense, int8, gguf; the session asks
    ``engine.models.weights_mode.weights_mode``, since the reading wing stands below the models wing)."""
    device = next(model.parameters()).device
    return f"{cost_key}|{machine_name(device)}|torch {torch.__version__}|{weights}"


def machine_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda {torch.cuda.get_device_name(device)}"
    return f"cpu {cpu_model()} x{os.cpu_count()}"


class _Measurement:
    """One model's measurement: the rate once known, and the thread measuring it meanwhile."""

    def __init__(self):
        self.rate: ReadRate | None = None
        self.thread: threading.Thread | None = None
        self.then: list[Callable[[], object]] = []  # what runs after the measurement under way
        self.lock = threading.Lock()


_MEASUREMENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {rate key: _Measurement}


def _measurement(model, key: str) -> _Measurement:
    return _MEASUREMENTS.setdefault(model, {}).setdefault(key, _Measurement())


def known_rate(model, key: str, costs: ReadCosts) -> ReadRate | None:
    """The rate measured for ``key``: in this process, or kept by an earlier start in ``costs``'s file."""
    state = _measurement(model, key)
    if state.rate is None:
        state.rate = ReadRate.from_json(costs.rate(key))
    return state.rate


def measure_in_background(model, key: str, costs: ReadCosts, probe: LoadProbe, measure: Callable[..., ReadRate | None],
                          then: Callable[[], object] | None = None) -> threading.Thread | None:
    """Starts measuring ``key``'s rate on a background thread unless it is known or being
    measured; returns the thread measuring it (None when it is known: ``then`` has run already).

    ``measure(should_stop, give_way)`` measures (``measure_read_rate`` with the model's forward); it is stopped as
    soon as a read or an answer computes (``probe.busy``), and not kept then, and pauses between layers while a
    visitor's plan is being made (``probe.foreground``: the first upload's plan does not share the cores with it). ``then()`` runs after it, whatever the outcome
    (the app finds the retrieval heads next, so the two do not share the cores); with one under way, after that one."""
    state = _measurement(model, key)
    with state.lock:
        running = state.thread is not None and state.thread.is_alive()
        if running or known_rate(model, key, costs) is not None:
            thread = state.thread if running else None
            if running and then is not None:
                state.then.append(then)
                then = None
        else:
            thread = state.thread = threading.Thread(target=_measure, args=(state, key, costs, probe, measure),
                                                     name="read-rate", daemon=True)
            state.then = [then] if then is not None else []
            then = None
    if then is not None:  # nothing to measure
        then()
    elif thread is not None and not thread.is_alive() and thread.ident is None:
        logger.info("measuring this machine's reading cost in the background (plans show a provisional estimate "
                    "until it lands; a read stops it)")
        thread.start()
    return thread


def _measure(state: _Measurement, key: str, costs: ReadCosts, probe: LoadProbe, measure) -> None:
    try:
        rate = None
        if not probe.busy:
            with probe.background():
                try:
                    rate = measure(lambda: probe.busy, lambda: _wait_while_planning(probe))
                except Exception:  # an estimate is an extra: the app serves without it
                    logger.warning("could not measure the reading cost; the plan's estimate stays provisional",
                                   exc_info=True)
        if rate is None:
            logger.info("reading-cost measurement stopped: a read started (its own chunk timings price the next)")
        else:
            state.rate = rate
            costs.keep_rate(key, asdict(rate))
    finally:
        with state.lock:
            then, state.then = state.then, []
        for run in then:
            run()


def _wait_while_planning(probe: LoadProbe, poll: float = 0.02) -> None:
    """Blocks while a visitor's plan is being made (``LoadProbe.foreground``), unless a read starts meanwhile."""
    while probe.planning and not probe.busy:
        time.sleep(poll)


def provisional_estimate(work_flops: float, probe_seconds: float, probe_flops: float) -> ReadEstimate:
    """Before the measurement lands: the read's FLOPs at the load probe's matmul rate now (a read ran at about
    ``_PROBE_EFFICIENCY`` of it here), shown within ``_PROVISIONAL_SPREAD`` either way, marked provisional."""
    likely = work_flops / max(_PROBE_EFFICIENCY * probe_flops / probe_seconds, 1e-9)
    return ReadEstimate(likely / _PROVISIONAL_SPREAD, likely, likely * _PROVISIONAL_SPREAD, provisional=True)
