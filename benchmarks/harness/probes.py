"""Single measurements, each returning the metrics of one record.

- ``time_prefill``: a real prefill of ``length`` random tokens (median of N, fresh cache each time)
- ``time_decode``: decode steps on a cache filled with ``context`` random tokens (median of N steps)
- ``frontier``: does ``context`` fit? the memory peak of a prefill's last chunk and of a decode step

Out-of-memory is a result (status ``oom`` on the device, ``host_oom`` for pinned host memory), not a crash.
"""

from __future__ import annotations

import logging
import statistics
import time

import torch

from engine.kv import quant
from engine.errors import PlanError
from engine.read_time.flops import estimate_prefill_seconds

from .fill import fill_random
from .models import random_ids
from .modes import Mode, Runner, headinfer_layout, offloaded_heads
from .timing import release_memory, time_once, track_peaks

logger = logging.getLogger(__name__)


class HostMemoryShort(RuntimeError):
    """The pinned host memory a probe needs is predicted not to exist (never tried: the OOM killer bites)."""


def time_prefill(runner: Runner, mode: Mode, length: int, *, repeats: int = 3, max_seconds: float = 60.0) -> dict:
    """Seconds to prefill ``length`` tokens; head-wise homes are allocated before the clock starts."""
    runner.use(mode)
    ids = random_ids(runner.model, length, device=runner.device)
    check_host(runner, mode, length)
    samples, peaks, layout = [], None, {}
    for _ in range(max(1, repeats)):
        cache = _ready_cache(runner, mode, length)
        with track_peaks(runner.device) as peaks, torch.inference_mode():
            samples.append(time_once(lambda: runner.prefill(mode, cache, ids), runner.device))
        if mode.is_headinfer:
            layout = headinfer_layout(cache)
        del cache
        release_memory(runner.device)
        if sum(samples) >= max_seconds:
            break
    seconds = statistics.median(samples)
    return {"seconds": seconds, "samples": samples, "tokens_per_s": length / seconds, **peaks.as_dict("prefill_peak"),
            **layout, **_prediction(runner, mode, length)}


def warm_up(runner: Runner, mode: Mode, length: int = 1024) -> None:
    """One untimed short prefill and decode step: kernels chosen, allocator and caches warm."""
    length = min(length, runner.chunk_size)
    time_prefill(runner, mode, length, repeats=1)
    time_decode(runner, mode, length, steps=1, warmup=1)


def time_decode(runner: Runner, mode: Mode, capacity: int, *, steps: int = 8, warmup: int = 2) -> dict:
    """Seconds per decode step at ``capacity - warmup - steps`` cached tokens (the cache ends full)."""
    runner.use(mode)
    context = capacity - warmup - steps
    check_host(runner, mode, capacity)
    cache = runner.make_cache(mode, capacity)
    shape = runner.shape
    fill_random(cache, context, head_dim=shape.head_dim, num_kv_heads=shape.num_kv_heads,
                device=runner.device, dtype=runner.dtype)
    tokens = random_ids(runner.model, warmup + steps, device=runner.device, seed=1)
    samples = []
    with track_peaks(runner.device) as peaks, torch.inference_mode():
        for i in range(warmup):
            runner.decode_step(cache, tokens[:, i : i + 1])
        host_before = getattr(cache, "host_attention_seconds", 0.0)
        for i in range(warmup, warmup + steps):
            samples.append(time_once(lambda: runner.decode_step(cache, tokens[:, i : i + 1]), runner.device))
        host_per_token = (getattr(cache, "host_attention_seconds", 0.0) - host_before) / steps
    seconds = statistics.median(samples)
    heads = offloaded_heads(mode, cache, shape)
    layout = headinfer_layout(cache) if mode.is_headinfer else {}
    del cache
    release_memory(runner.device)
    element = quant.bytes_per_element(mode.kv_dtype, shape.dtype_bytes, shape.head_dim)  # 8-bit: codes + scales
    return {"seconds_per_token": seconds, "tokens_per_s": 1.0 / seconds, "samples": samples, "kv_tokens": context,
            "host_attention_s_per_token": host_per_token,
            "offloaded_kv_bytes": int(heads * context * shape.head_dim * 2 * element),
            **peaks.as_dict("decode_peak"), **layout, **_prediction(runner, mode, capacity)}


def frontier(runner: Runner, mode: Mode, capacity: int, *, real_run_seconds: float = 30.0,
             flops_per_second: float = 2e14) -> dict:
    """Runs a context of ``capacity`` tokens at its memory peaks: the last prefill chunk and one decode step.

    A real prefill when it should take under ``real_run_seconds``; otherwise a cache filled with random values
    up to the last chunk (the peak of a chunked prefill is its last chunk, whatever came before).
    Returns metrics with ``status`` ``ok`` / ``oom`` / ``host_oom``.
    """
    runner.use(mode)
    shape = runner.shape
    is_real = not mode.is_chunked or estimate_prefill_seconds(shape, capacity, flops_per_second) <= real_run_seconds
    metrics = {"probe": "real" if is_real else "filled", **_prediction(runner, mode, capacity)}
    started = time.monotonic()
    cache = None
    try:
        check_host(runner, mode, capacity)
        cache = runner.make_cache(mode, capacity)
        with torch.inference_mode():
            if is_real:
                prompt = random_ids(runner.model, capacity - 1, device=runner.device)
            else:
                past = max(0, capacity - 1 - runner.chunk_size)
                fill_random(cache, past, head_dim=shape.head_dim, num_kv_heads=shape.num_kv_heads,
                            device=runner.device, dtype=runner.dtype)
                prompt = random_ids(runner.model, capacity - 1 - past, device=runner.device)
            with track_peaks(runner.device) as prefill_peaks:
                runner.prefill(mode, cache, prompt)
            with track_peaks(runner.device) as decode_peaks:
                runner.decode_step(cache, prompt[:, -1:])
        metrics.update(status="ok", **prefill_peaks.as_dict("prefill_peak"), **decode_peaks.as_dict("decode_peak"))
        metrics.update(against_plan(metrics, runner.cuda_context_bytes))
        if mode.is_headinfer:
            metrics.update(headinfer_layout(cache))
    except Exception as exc:
        status = failure_status(exc)
        if status is None:
            raise
        metrics.update(status=status, reason=str(exc).splitlines()[0][:300])
    finally:
        cache = None  # the cache (and any tensors of a failed forward) must go before the next probe
        metrics["seconds"] = time.monotonic() - started
        release_memory(runner.device)
    return metrics


def against_plan(metrics: dict, context_bytes: int | None) -> dict:
    """How far a probe's peaks went past the plan's GPU bytes (negative: under), counted three ways: allocated
    bytes (what the plan models), the caching allocator's reserved bytes (what the card gives up), and NVML's
    figure less the CUDA context (what the card shows). ``holds_on_card``: all three within the plan. The first
    GPU run's 100K prefill held in allocated bytes (23.45e9 of 23.59e9) but not on the card: reserved 25.68e9,
    NVML 25.78e9. Empty for baselines (no plan) and off CUDA (no peaks)."""
    planned = metrics.get("planned_gpu_bytes")
    peak = lambda kind: max((metrics.get(f"{phase}_peak_{kind}") for phase in ("prefill", "decode")  # noqa: E731
                             if metrics.get(f"{phase}_peak_{kind}") is not None), default=None)
    allocated, reserved, nvml = peak("allocated"), peak("reserved"), peak("nvml_used")
    if planned is None or allocated is None:
        return {}
    over = {"over_plan_allocated": allocated - planned}
    if reserved is not None:
        over["over_plan_reserved"] = reserved - planned
    if nvml is not None and context_bytes is not None:
        over["over_plan_nvml"] = nvml - context_bytes - planned
    holds = all(value <= 0 for value in over.values())
    if not holds:
        logger.warning("peak past the plan's %.2f GiB: %s", planned / 2**30,
                       ", ".join(f"{k.removeprefix('over_plan_')} {v / 2**30:+.2f} GiB" for k, v in over.items()))
    return {**over, "holds_on_card": holds}


def failure_status(exc: BaseException) -> str | None:
    """``oom`` / ``host_oom`` / ``refused`` (the planner says it cannot fit) for a memory failure, else None."""
    if isinstance(exc, HostMemoryShort):
        return "host_oom"
    if isinstance(exc, torch.OutOfMemoryError):
        return "oom"
    if isinstance(exc, PlanError):
        return "refused"
    if isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower():
        return "host_oom"  # a failed pinned (cudaHostAlloc) allocation surfaces as a plain CUDA error
    return None


def host_bytes_needed(runner: Runner, mode: Mode, capacity: int) -> int:
    """Page-locked host bytes a cache of ``capacity`` tokens takes.

    Head-wise homes are locked at their exact size (``cudaHostRegister``); transformers' offloaded layers go
    through torch's pinned allocator, which rounds every block up to a power of two.
    """
    if not runner.is_cuda or mode.kind in ("standard", "chunked"):
        return 0
    shape = runner.shape
    per_head = capacity * shape.head_dim * shape.dtype_bytes  # K (or V) of one KV head of one layer
    if mode.kind == "layerwise":
        layer = _pow2(shape.num_kv_heads * per_head)
        return 2 * layer * (shape.num_layers + 2)  # every layer's K and V, plus the one being re-offloaded
    plan = runner.plan(mode, capacity)
    if mode.kv_dtype is not None or mode.has_disk_tier:  # codes and scales; a disk tier's share is not pinned
        return plan.host_bytes
    offloaded_homes = plan.total_slots - plan.resident_slots
    return 2 * offloaded_homes * plan.head_group_size * per_head


def check_host(runner: Runner, mode: Mode, capacity: int) -> None:
    """Raises ``HostMemoryShort`` when the pinned store cannot fit the host budget."""
    needed = host_bytes_needed(runner, mode, capacity)
    if runner.host_budget is not None and needed > runner.host_budget:
        raise HostMemoryShort(f"{mode.name} at {capacity} tokens needs {needed / 2**30:.1f} GiB pinned, "
                              f"host budget {runner.host_budget / 2**30:.1f} GiB")


def _ready_cache(runner: Runner, mode: Mode, capacity: int):
    cache = runner.make_cache(mode, capacity)
    if mode.is_headinfer:  # pinned homes are allocated once per document, not per prefill: keep them off the clock
        shape = runner.shape
        cache.allocate(1, shape.head_dim, runner.dtype, runner.device)
    return cache


def _prediction(runner: Runner, mode: Mode, context: int) -> dict:
    plan = runner.plan(mode, context)
    if plan is None:
        return {}
    return {"planned_gpu_bytes": plan.gpu_bytes, "planned_host_bytes": plan.host_bytes,
            "planned_fits": plan.fits, "planned_group": plan.head_group_size, "planned_resident": plan.resident_slots}


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
