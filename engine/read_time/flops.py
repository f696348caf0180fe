"""The planner's FLOP model of a read (``estimate_prefill_seconds``: 2 FLOPs per parameter per token plus causal
attention's pairs) and the model's FLOP rate on this machine (``measured_flop_rate``) that turns it into seconds.
The picker's estimates (``models/catalogue.py``) use both; a session's estimates use the FLOP model's shape
(``pace.prefill_work``, ``estimator.ReadEstimator._work_shape``) and price it from measured reads.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable

import torch

from ..errors import PlanError
from ..planning.machine import no_forward_in_flight, synchronize
from ..planning.shape import ModelShape


def estimate_prefill_seconds(shape: ModelShape, tokens: int, flops_per_second: float) -> float:
    """Rough prefill time: 2 FLOPs per parameter per token plus causal attention.

    Attention costs 4 * num_heads * head_dim FLOPs per (query, key) pair (QK^T and PV);
    a full layer has S^2/2 causal pairs, a sliding layer about S*w - w^2/2.
    """
    if flops_per_second <= 0:
        raise PlanError(f"flops_per_second must be positive, got {flops_per_second!r}")
    if tokens < 0:
        raise PlanError(f"tokens must be >= 0, got {tokens!r}")
    pairs = 0.0
    for window in shape.sliding_windows or (None,) * shape.num_layers:
        w = tokens if window is None else min(window, tokens)
        pairs += tokens * w - w * w / 2
    flops = 2.0 * shape.num_params * tokens + 4.0 * shape.num_heads * shape.head_dim * pairs
    return flops / flops_per_second


# FLOP rate measured per loaded model, so each browser session does not re-measure it.
_MEASURED_RATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def measured_flop_rate(model, shape, num_tokens: int = 512, forward: Callable | None = None) -> float:
    """The model's FLOP rate on this machine (one forward of ``num_tokens``, measured once per model), in the units
    of ``estimate_prefill_seconds``. 512 tokens: the shape of a real prefill step (at 128 the matmuls are
    too small to run at a read's rate: docs/benchmarks/estimate-error.md, Notes from the code).

    ``forward(ids)``: runs one forward the way a read does (a session passes one through its cache, keeping the
    last logit only); by default a plain cacheless forward, whose attention and all-position logits run slower
    than a read's (the same report)."""
    rate = _MEASURED_RATES.get(model)
    if rate is None:
        device = next(model.parameters()).device
        ids = torch.randint(0, shape.vocab_size, (1, num_tokens), device=device)
        run = forward or (lambda chunk: model(chunk, use_cache=False))
        no_forward_in_flight()
        with torch.inference_mode():
            run(ids[:, :8])  # warm-up
            synchronize(device)  # (on a GPU a forward only launches kernels: the clock must see them run)
            start = time.perf_counter()
            run(ids)
            synchronize(device)
            seconds = time.perf_counter() - start
        rate = _MEASURED_RATES[model] = estimate_prefill_seconds(shape, num_tokens, 1.0) / max(seconds, 1e-6)
    return rate
