"""How long a read takes here, before it runs: one ``ReadEstimator`` per session (``DocumentSession.read_time``) holds
the recorded reads' chunk timings (``costs.ReadCosts``), the load probe, and this machine's measured rate
(``read_rate``), and answers ``estimate_prefill_range`` with a ``read_rate.ReadEstimate`` (low, likely, high seconds)
from ``read_model``: the rate scaled to the recorded reads, at the load measured now.

Why a holder of its own: the estimate needs the model, its shape, the policy's chunking and KV dtype, and two keys
(costs per model/device/dtype/KV policy; a measured rate per that, the machine, torch and the weights mode); in the
session they were eight methods and four fields beside reading and answering. The session records each read's chunk
timings here (``load_probe``, ``read_costs``, ``costs_key``) and hands the app this object.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ..cache import HeadInferCache, cache_argument
from ..paths import cache_dir
from ..planning.policy import OffloadPolicy
from ..planning.shape import ModelShape
from .costs import CostFit, ReadCosts, load_probe, pairs, shared_read_costs
from .pace import prefill_step, prefill_work
from .read_model import CPU_LOAD_EXPONENT, ReadModel, calibrated
from .read_rate import (ReadEstimate, ReadRate, attention_floor, known_rate, measure_in_background, measure_read_rate,
                        pair_cost_ratio, provisional_estimate, rate_key)


class ReadEstimator:
    """The reading-time estimates of one session's model, policy and machine (``estimate_prefill_range``), and the
    first start's background measurement of this machine's reading cost (``measure_read_rate_in_background``)."""

    def __init__(self, model, shape: ModelShape, policy: OffloadPolicy, read_costs: ReadCosts | None = None, *,
                 weights: str):
        """``read_costs``: where completed reads' chunk timings are kept and estimates learn from (default: the
        shared record in the studio's cache folder); ``weights``: how the model holds its weights
        (``engine.models.weights_mode.weights_mode``), part of the measured rate's key."""
        self.model, self.shape, self.policy, self.weights = model, shape, policy, weights
        self.device = next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        if read_costs is None:
            read_costs = shared_read_costs(cache_dir() / "read-costs.json")
        self.read_costs = read_costs
        self.load_probe = load_probe(self.device)
        name = getattr(model.config, "_name_or_path", "") or model.config.model_type
        kv = f"{self.policy.kv_dtype or 'exact'}{'+disk' if self.policy.disk_dir else ''}"
        self.costs_key = f"{name}|{self.device.type}|{dtype}|{kv}"  # what a read's chunk timings are kept under

    def estimate_prefill_seconds(self, num_tokens: int, start: int = 0) -> float:
        """Seconds to prefill tokens ``start..num_tokens``, likely (``estimate_prefill_range``'s middle)."""
        return self.estimate_prefill_range(num_tokens, start)[1]

    def estimate_prefill_range(self, num_tokens: int, start: int = 0) -> ReadEstimate:
        """(low, likely, high) seconds to prefill tokens ``start..num_tokens``: ``read_model()`` at the load a probe
        of a fraction of a second measures now; a pure function of those tokens, this machine's measured rate and
        that load, so nothing else moves it (``engine.read_time.read_model``). Never waits for the measurement:
        while none landed and no read was recorded (it is started here if it was not), the estimate is the load
        probe's, wide and ``provisional``."""
        probe = self.load_probe.current()
        model = self.read_model()
        if model is None:
            self.measure_read_rate_in_background()
            return provisional_estimate(prefill_work(self.shape, start, num_tokens), probe.seconds,
                                        self.load_probe.flops)
        return model.estimate(self._num_forwards(start, num_tokens), start, num_tokens, probe)

    def read_model(self) -> ReadModel | None:
        """This machine's reading cost now: the measured rate (the background measurement's, else the planner's FLOP
        model), scaled to the reads recorded here; None while neither a measurement nor a read is known. Changes
        only when a measurement lands or a read is recorded."""
        timed = self.read_costs.timed_reads(self.costs_key)
        rate = known_rate(self.model, self._rate_key, self.read_costs)
        if rate is None:
            if not timed:
                return None
            work = self._work_shape()  # no measurement (a read stopped it): the FLOP model's split, at unit load
            rate = ReadRate(0.0, work.per_token, work.per_pair, probe_seconds=1.0)
        exponent = CPU_LOAD_EXPONENT if self.device.type == "cpu" else 1.0
        return calibrated(rate, timed, exponent)

    @property
    def reading_cost_known(self) -> bool:
        """Whether a plan's reading time is measured now (a recorded read here, or this machine's reading cost), not
        ``provisional``: cheap (no load probe, no measurement started), for the app's panel to refresh "estimating…"
        once the background measurement lands."""
        return bool(self.read_costs.reads(self.costs_key)) or known_rate(self.model, self._rate_key,
                                                                         self.read_costs) is not None

    def measure_read_rate_in_background(self, then: Callable[[], object] | None = None):
        """Starts measuring this machine's reading cost on a background thread (``engine.read_time.read_rate``) unless a read
        was recorded, the cost is known (kept by an earlier start) or it is being measured; returns the thread or
        None. ``then()`` runs after it (at once when nothing starts)."""
        if self.read_costs.reads(self.costs_key):
            if then is not None:
                then()
            return None
        # A CPU's attention costs a fixed multiple of its FLOP share; elsewhere at least its share.
        tied = self.device.type == "cpu"
        floor = (pair_cost_ratio if tied else attention_floor)(self._work_shape())
        measure = lambda should_stop, give_way: measure_read_rate(
            self.model, self.shape.vocab_size, self._read_forward, lambda: self.load_probe.measure().seconds,
            should_stop, give_way, pair_floor=floor, tied=tied)
        return measure_in_background(self.model, self._rate_key, self.read_costs, self.load_probe, measure, then)

    def making_a_plan(self):
        """A context manager for the app's upload handler: while a visitor waits for a plan, the background
        reading-cost measurement pauses between layers (the plan does not share the cores with it)."""
        return self.load_probe.foreground()

    @functools.cached_property
    def _rate_key(self) -> str:
        return rate_key(self.model, self.costs_key, self.weights)

    def _num_forwards(self, start: int, stop: int) -> int:
        """Forwards a read of tokens ``[start, stop)`` takes (``DocumentSession.prefill``'s steps)."""
        count, done = 0, start
        while done < stop:
            done += min(prefill_step(self.policy.chunk_size, self.device.type, done), stop - done)
            count += 1
        return count

    def _work_shape(self) -> CostFit:
        """The planner's FLOP model of a read as ``per_token · tokens + per_pair · pairs`` (sliding-window layers'
        attention, linear past the window, approximated over the contexts a read spans)."""
        return CostFit.of([(float(n), pairs(n), prefill_work(self.shape, 0, n)) for n in (512, 2048, 8192, 32768)])

    def _read_forward(self, ids: torch.Tensor) -> None:
        """One forward of ``ids`` ([1, N]) as a read runs it: through a head-wise cache of its own, last logit only."""
        cache = HeadInferCache(self.model.config, self.policy, device=self.device, chunk_size=ids.shape[1],
                               max_context=ids.shape[1], disk_dir=None)
        try:
            self.model(ids, **{cache_argument(self.model): cache}, use_cache=True, logits_to_keep=1)
        finally:
            cache.release()
