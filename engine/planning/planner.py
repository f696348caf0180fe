"""Memory planner: the HeadInfer paper's memory model turned into a plan for one context length.

All figures are bytes unless a name says GiB. The model follows the paper's appendix
("Memory Analysis of Llama-3-8B Inference"): weights + on-device KV + chunk activations,
with the head-wise KV cache split into (layer, head group) *slots* that either stay
resident on the compute device or live in host memory and stream through two
ping-pong buffers.

The shape and its byte counts live in ``engine.planning.shape``, what a plan says in ``engine.planning.plan``, its
refusal (``PlanError``) in ``engine.errors``: each name is imported from its one home (issue 33).
"""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path

import torch

from ..kv import windowed
from ..kv.kernels import SCORE_TILE_BYTES, TILED_LIVE_TILES
from .allocations import (longest_streamed_run, planned_allocations, scratch_elements, slot_placement,
                                        streamed_runs)
from .host_split import forecast_decode, host_share
from .pinning import with_pinning
from .plan import GIB, LIMIT_MAX_CONTEXT, LIMIT_MEMORY, LIMIT_MODEL, MAX_CONTEXT, Plan
from ..errors import PlanError
from .policy import OffloadPolicy
from .shape import (ModelShape, disk_stream_bytes, host_element_bytes, host_layer_token_bytes, stored_kv_bytes,
                    stored_tokens)

__all__ = [
    "LIMIT_MAX_CONTEXT", "LIMIT_MEMORY", "LIMIT_MODEL", "disk_stream_bytes", "host_element_bytes", "make_plan",
    "paper_memory_table", "stored_tokens",
]

logger = logging.getLogger(__name__)

_LOGIT_BYTES = 4  # logits are materialised in fp32 for the last token only
#: Host time one fetch costs a decode step whatever its size (its copy, events and attention call): about 260 us
#: per group on the first H200 run (issue 29), what bigger ping-pong buffers save by fetching runs at once.
FETCH_SECONDS = 250e-6
#: The upload rate a plan assumes where the machine's is not measured: a desktop's PCIe 4 x16 (a 4090 PC).
DESKTOP_LINK_GBPS = 24.0


def _size(n: int) -> str:
    """Precise enough that a need and a budget that differ never print the same."""
    return f"{n / GIB:.3f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


def _within(used: int, budget: int | None) -> bool:
    return budget is None or used <= budget


def _visible_tokens(shape: ModelShape, context: int, chunk: int) -> int:
    """Tokens one layer's attention reads while processing a chunk (conservative max over layers)."""
    windows = shape.sliding_windows
    if not windows or any(w is None for w in windows):
        return context
    # A sliding layer sees its window plus the chunk being appended.
    return min(context, max(windows) + chunk)


def _footprint(shape: ModelShape, context: int, chunk: int, group: int, resident: int,
               cuda: bool, kv_dtype: str | None = None, activations: int | None = None,
               per_buffer: int = 1) -> tuple[dict, int, int]:
    """Returns (gpu breakdown, gpu bytes, host bytes) for a fully resolved configuration; ``activations``: the
    peak a dry-run chunk measured (``telemetry.measure_activation_peak``), else the paper's estimate;
    ``per_buffer``: head groups' visible context each ping-pong buffer holds (``Plan.groups_per_buffer``)."""
    weights = shape.weights_bytes
    if activations is None:
        activations = min(chunk, context) * (shape.hidden_size + 2 * shape.intermediate_size) * shape.dtype_bytes
    logits = shape.vocab_size * _LOGIT_BYTES
    kv_stored = _kv_stored(shape, context, chunk, kv_dtype)  # every layer, as stored in RAM (8-bit: + scales)
    if not cuda:  # compute happens on the host, so everything is host memory
        breakdown = dict.fromkeys(("weights", "kv_buffers", "kv_resident", "kv_codes", "attention", "activations",
                                   "logits", "sources"), 0)
        # The KV core's buffers are host memory too: two staging buffers of a chunk, and (some homes streamed)
        # two ping-pong buffers and, for 8-bit homes, their code planes.
        per_head = shape.head_dim * 2 * shape.dtype_bytes  # (the largest head_dim: what buffers are sized by)
        buffers = 2 * chunk * _staged_elements(shape) * 2 * shape.dtype_bytes
        if resident < _total_slots(shape, group) or kv_dtype is not None:
            buffers += 2 * per_buffer * group * _visible_tokens(shape, context, chunk) * per_head
        buffers += _device_codes(shape, context, chunk, group, kv_dtype, per_buffer)
        # CPU SDPA reads strided K/V: no scratch copies (none planned unless ``kernels.FUSED_DEVICES`` says so).
        attention = _scratch_buffer(shape, context, chunk, group, cuda=False, per_buffer=per_buffer) + _window_scratch(
            shape, context, chunk, group, cuda=False, batch=per_buffer)
        return breakdown, 0, weights + kv_stored + activations + logits + buffers + attention
    # K and V of one head, one layer, one token (layers that differ: the largest head_dim, which sizes the buffers
    # and bounds any resident slot's home)
    per_head = shape.head_dim * 2 * shape.dtype_bytes
    device_head = _visible_tokens(shape, context, chunk) * per_head
    resident_heads = resident * group  # (every group holds ``group`` KV heads: it divides every layer's)
    # Two staging buffers hold a chunk's K/V of every KV head (of the largest layer) in home layout while appended.
    staging = 2 * min(chunk, context) * _staged_elements(shape) * 2 * shape.dtype_bytes
    breakdown = {
        "weights": weights,
        "kv_buffers": 2 * per_buffer * group * device_head + staging,  # ping-pong: one computing, one loading
        "kv_resident": resident * group * device_head,
        "kv_codes": _device_codes(shape, context, chunk, group, kv_dtype, per_buffer),
        "attention": _attention_scratch(shape, context, chunk, group, per_buffer),
        "activations": activations,
        "logits": logits,
        # The sources pass stacks the keys of its heads where their homes are: resident ones on the device.
        "sources": _sources_bytes(shape, context, chunk, group) * resident_heads // shape.total_kv_heads,
    }
    # Offloaded heads spread evenly over the layers: their share of what every layer stores.
    host = kv_stored * (shape.total_kv_heads - resident_heads) // shape.total_kv_heads
    return breakdown, sum(breakdown.values()), host


def _staged_elements(shape: ModelShape) -> int:
    """K (or V) elements of one token of the layer with the most: what a staging buffer holds per token."""
    return max(shape.layer_kv_elements)


def _total_slots(shape: ModelShape, group: int) -> int:
    """(layer, head group) slots: every KV layer's groups of ``group`` heads."""
    return sum(shape.groups_per_layer(group))


def _sources_bytes(shape: ModelShape, context: int, chunk: int, group: int) -> int:
    return planned_allocations(shape, capacity=context, chunk=chunk, group=group, resident_slots=0, disk_slots=0,
                               cuda=True, kv_dtype=None, host_attention=False)["sources"]


def _device_codes(shape: ModelShape, context: int, chunk: int, group: int, kv_dtype: str | None,
                  per_buffer: int = 1) -> int:
    """8-bit KV on the device: code planes beside the ping-pong and staging buffers, and quantizing a staged chunk
    (its absolute values and scaled copy, fp32). Dequantizing runs in place in the ping-pong buffer."""
    if kv_dtype is None:
        return 0
    groups = max(shape.groups_per_layer(group))
    rows = 2 * group * (shape.head_dim + 4)  # one token of one group: codes + fp32 scales, K and V
    staged = min(chunk, context)
    quantize = 2 * staged * _staged_elements(shape) * 2 * 4
    return 2 * (per_buffer * _visible_tokens(shape, context, chunk) + staged * groups) * rows + quantize


def _attention_scratch(shape: ModelShape, context: int, chunk: int, group: int, per_buffer: int = 1) -> int:
    """Attention's memory without flash-attn: the cache's scratch buffer (SDPA's contiguous K/V of a run of
    ``per_buffer`` groups, repeated for the query heads where fp32 needs the memory-efficient kernel; allocated once,
    held throughout) plus the larger temporary of a windowed chunk's query blocks (their K/V in that buffer) or the
    softcap path's score tiles."""
    tiles = TILED_LIVE_TILES * SCORE_TILE_BYTES if shape.attn_softcap else 0
    return _scratch_buffer(shape, context, chunk, group, cuda=True, per_buffer=per_buffer) + max(
        tiles, _window_scratch(shape, context, chunk, group, cuda=True, batch=per_buffer))


def _scratch_buffer(shape: ModelShape, context: int, chunk: int, group: int, cuda: bool, per_buffer: int = 1) -> int:
    """The attention scratch of a cache whose homes hold ``context`` tokens (``allocations.scratch_elements``)."""
    return scratch_elements(shape, capacity=context, chunk=chunk, group=group, cuda=cuda,
                            groups_per_buffer=per_buffer) * shape.dtype_bytes


def _window_scratch(shape: ModelShape, context: int, chunk: int, group: int, cuda: bool, batch: int = 1) -> int:
    """One group's windowed chunk (``kv.windowed``) besides the scratch buffer: a block's mask, folded queries and
    SDPA's buffers; ``batch``: the groups of a run attended in one call."""
    windows = [w for w in shape.sliding_windows if w is not None]
    if not windows:
        return 0
    n_rep = shape.num_heads // shape.min_kv_heads
    return windowed.scratch_bytes(batch, group * n_rep, group, shape.head_dim, max(windows), min(chunk, context),
                                  shape.dtype_bytes, cuda, cpu_threads=torch.get_num_threads(), kv_in_scratch=True)


def _resolve(shape: ModelShape, policy: OffloadPolicy, context: int, cuda: bool, gpu_budget: int | None,
             host_budget: int | None = None, activations: int | None = None,
             link_gbps: float | None = None) -> tuple[int, int, int]:
    """Picks (head_group_size, resident_slots, groups_per_buffer): policy values win, None means adaptive.

    The group first (with buffers of one group, as the paper plans them). Then each ping-pong buffer holds as many
    groups' worth of context as the budget allows, at most a layer's longest run of streamed groups: a run is then
    one copy, one set of events and one attention call (the host's fixed cost per fetch was most of a decode token
    at short contexts). Where resident slots are adaptive too, a bigger buffer costs resident slots (two per group
    it grows by), so the size whose decode step is predicted shortest wins: streamed bytes over the link
    (``link_gbps``, measured or a desktop's) plus ``FETCH_SECONDS`` per fetch. Long contexts keep the slots (a
    fetch is then large next to its fixed cost); where the memory is not contested the buffers take a whole run."""
    group, resident = _resolve_slots(shape, policy, context, cuda, gpu_budget, activations, per_buffer=1)
    num_groups = max(shape.groups_per_layer(group))
    if policy.groups_per_buffer is not None:
        return group, resident, max(1, min(policy.groups_per_buffer, _longest_run(shape, group, resident, cuda,
                                                                                  policy.kv_dtype)))
    if policy.resident_slots is not None or not cuda or gpu_budget is None:  # the buffers contest nothing else
        return group, resident, _groups_that_fit(shape, policy, context, group, resident, cuda, gpu_budget,
                                                 host_budget, activations,
                                                 _longest_run(shape, group, resident, cuda, policy.kv_dtype))
    slot_seconds = (group * _visible_tokens(shape, context, policy.chunk_size) * shape.head_dim * 2
                    * host_element_bytes(shape, policy.kv_dtype)) / ((link_gbps or DESKTOP_LINK_GBPS) * 1e9)
    most = _groups_that_fit(shape, policy, context, group, 0, cuda, gpu_budget, host_budget, activations, num_groups)
    best = (math.inf, 1, resident)
    for per_buffer in range(1, most + 1):
        if per_buffer > 1:
            _, resident = _resolve_slots(shape, policy, context, cuda, gpu_budget, activations, per_buffer)
        runs = _runs(shape, group, resident, cuda, policy.kv_dtype)
        if per_buffer > max(runs, default=0):
            continue  # a buffer larger than any run: its memory buys nothing
        seconds = sum(runs) * slot_seconds + sum(-(-run // per_buffer) for run in runs) * FETCH_SECONDS
        if seconds < best[0]:
            best = (seconds, per_buffer, resident)
    return group, best[2], best[1]


def _runs(shape: ModelShape, group: int, resident: int, cuda: bool, kv_dtype: str | None) -> list[int]:
    """Every layer's runs of streamed groups with ``resident`` slots placed as the cache places them."""
    groups = shape.groups_per_layer(group)
    on_device, _ = slot_placement(sum(groups), resident, 0, cuda=cuda, quantized=kv_dtype is not None)
    return streamed_runs(groups, on_device, set())


def _longest_run(shape: ModelShape, group: int, resident: int, cuda: bool, kv_dtype: str | None) -> int:
    return max(_runs(shape, group, resident, cuda, kv_dtype), default=0)


def _groups_that_fit(shape: ModelShape, policy: OffloadPolicy, context: int, group: int, resident: int, cuda: bool,
                     gpu_budget: int | None, host_budget: int | None, activations: int | None, most: int) -> int:
    """The most groups (1 to ``most``) a ping-pong buffer may hold with the budget that holds the buffers (the
    GPU's; on a CPU-only machine the host's) still met; 1 where even that does not fit (the plan says why)."""
    for per_buffer in range(most, 1, -1):
        _, gpu, host = _footprint(shape, context, policy.chunk_size, group, resident, cuda, policy.kv_dtype,
                                  activations, per_buffer)
        if _within(gpu, gpu_budget) if cuda else _within(host, host_budget):
            return per_buffer
    return 1


def _resolve_slots(shape: ModelShape, policy: OffloadPolicy, context: int, cuda: bool, gpu_budget: int | None,
                   activations: int | None, per_buffer: int) -> tuple[int, int]:
    """Picks (head_group_size, resident_slots) with ping-pong buffers of ``per_buffer`` groups' context."""
    kv, chunk = math.gcd(*shape.kv_heads), policy.chunk_size  # a group divides every layer's KV heads
    group = policy.head_group_size
    if group is None and not cuda:
        group = kv
    elif group is None:
        # Largest group first: fewer, bigger transfers and kernel launches per layer.
        divisors = [d for d in range(kv, 0, -1) if kv % d == 0]
        group = next((d for d in divisors
                      if _within(_footprint(shape, context, chunk, d, 0, True, policy.kv_dtype, activations)[1],
                                  gpu_budget)), 1)
    total = _total_slots(shape, group)
    if policy.resident_slots is not None:
        if policy.resident_slots > total:
            logger.debug("resident_slots=%d capped at %d slots", policy.resident_slots, total)
        return group, min(policy.resident_slots, total)
    if not cuda or gpu_budget is None:
        return group, total
    _, base, _ = _footprint(shape, context, chunk, group, 0, True, policy.kv_dtype, activations, per_buffer)
    slot = group * _visible_tokens(shape, context, chunk) * shape.head_dim * 2 * shape.dtype_bytes
    slot += -(-_sources_bytes(shape, context, chunk, group) * group // shape.total_kv_heads)
    return group, max(0, min(total, (gpu_budget - base) // slot))


def _checked_inputs(shape: ModelShape, policy: OffloadPolicy, context_tokens: int, machine,
                    device_is_cuda: bool | None, gpu_budget: int | None, host_budget: int | None, rates,
                    activation_bytes: int | None):
    """``make_plan``'s arguments checked (``PlanError`` for a context, policy or budget it cannot plan), and its
    device, budgets, rates and activation peak: a measured ``machine``'s, or a what-if plan's (the policy's budgets
    replacing the ones given)."""
    if isinstance(context_tokens, bool) or not isinstance(context_tokens, int) or context_tokens < 1:
        raise PlanError(f"context_tokens must be a positive integer, got {context_tokens!r}")
    try:
        policy.validate_for(shape.kv_heads)
    except ValueError as exc:
        raise PlanError(str(exc)) from exc
    if machine is not None:  # its budgets already are the policy's where it sets them (``measure_budget``)
        device_is_cuda, gpu_budget, host_budget = machine.device_is_cuda, machine.gpu_budget, machine.host_budget
        rates, activation_bytes = machine.rates, machine.activation_bytes
    elif device_is_cuda is None:
        raise PlanError("make_plan needs a machine or device_is_cuda")
    else:  # a what-if plan: the policy's budgets replace the ones given
        gpu_budget = policy.gpu_memory if policy.gpu_memory is not None else gpu_budget
        host_budget = policy.host_memory if policy.host_memory is not None else host_budget
    for name, budget in (("gpu_budget", gpu_budget), ("host_budget", host_budget)):
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise PlanError(f"{name} must be a positive number of bytes or None, got {budget!r}")
    return device_is_cuda, gpu_budget, host_budget, rates, activation_bytes


def _refusals(policy: OffloadPolicy, device_is_cuda: bool, breakdown: dict, max_ctx: int, gpu_need: tuple,
              host_need: tuple, disk_need: tuple) -> list[str]:
    """Why a plan does not fit, one reason per tier over its budget (each ``(needed, budget)``), closed by the
    context that does fit; empty when it fits."""
    (gpu, gpu_budget), (host, host_budget), (disk, disk_budget) = gpu_need, host_need, disk_need
    reasons = []
    if not _within(gpu, gpu_budget):
        reasons.append(
            f"GPU memory: needs {_size(gpu)} but the budget is {_size(gpu_budget)} "
            f"(weights {breakdown['weights'] / GIB:.2f}, KV buffers {breakdown['kv_buffers'] / GIB:.2f}, "
            f"resident KV {breakdown['kv_resident'] / GIB:.2f}, activations {breakdown['activations'] / GIB:.2f}); "
            "use a smaller head_group_size or chunk_size, or fewer resident_slots")
    if not _within(host, host_budget):
        what = "the offloaded KV cache" if device_is_cuda else "weights + KV cache + activations"
        reasons.append(f"host memory: {what} needs {_size(host)} but the budget is {_size(host_budget)}"
                       + ("" if policy.disk_dir else "; a disk tier (--kv-disk-dir) or 8-bit KV would hold more"))
    if not _within(disk, disk_budget):
        reasons.append(f"disk tier: needs {_size(disk)} in {policy.disk_dir} but {_size(disk_budget)} is free")
    if reasons:
        reasons.append(f"at most {max_ctx:,} context tokens fit with this configuration")
    return reasons


def make_plan(shape: ModelShape, policy: OffloadPolicy, context_tokens: int, *, machine=None,
              device_is_cuda: bool | None = None, gpu_budget: int | None = None, host_budget: int | None = None,
              rates=None, activation_bytes: int | None = None) -> Plan:
    """Plans a context of ``context_tokens`` tokens; budgets of ``None`` are unlimited.

    ``machine`` (an ``engine.planning.budgets.MachineBudget``, measured once per session) gives the device, budgets, rates
    and activation peak at once; the separate keywords are for what-if plans (the picker, capacity tables).

    ``rates`` (an ``engine.planning.machine_rates.MachineRates``) sets the decode split and its forecast; without them
    ``host_attention="auto"`` keeps every offloaded group streamed.

    ``activation_bytes``: the activation peak a dry-run chunk measured on this device (CUDA), replacing the estimate.
    ``policy.gpu_memory`` / ``policy.host_memory`` override the budget arguments (a ``machine`` carries them already).
    The plan reports ``fits=False`` with a reason rather than raising; call
    :meth:`Plan.require_fit` to turn that into a :class:`PlanError`.
    """
    device_is_cuda, gpu_budget, host_budget, rates, activation_bytes = _checked_inputs(
        shape, policy, context_tokens, machine, device_is_cuda, gpu_budget, host_budget, rates, activation_bytes)

    chunk = policy.chunk_size
    group, resident, per_buffer = _resolve(shape, policy, context_tokens, device_is_cuda, gpu_budget, host_budget,
                                           activation_bytes, rates.h2d_gbps if rates is not None else None)
    breakdown, gpu, host = _footprint(shape, context_tokens, chunk, group, resident, device_is_cuda, policy.kv_dtype,
                                      activation_bytes, per_buffer)
    total_slots = _total_slots(shape, group)
    disk_budget = _disk_budget(policy)
    candidates = total_slots - resident if device_is_cuda else total_slots  # CPU: every home is in RAM

    stream = disk_stream_bytes(shape, chunk, policy.kv_dtype) if device_is_cuda else 0

    def split(ctx: int, h: int) -> tuple[int, int, int]:
        if policy.disk_dir is None:
            return h, 0, 0
        kv_host = h if device_is_cuda else _kv_stored(shape, ctx, chunk, policy.kv_dtype)
        h, d, slots = _split_disk(h + stream, kv_host, candidates, host_budget)
        return (h, d, slots) if slots else (h - stream, d, slots)

    host, disk, disk_slots = split(context_tokens, host)
    if disk_slots:  # disk homes are fetched one at a time: runs end at them (the buffers were counted before)
        groups_per_layer = shape.groups_per_layer(group)
        on_device, on_disk = slot_placement(total_slots, resident, disk_slots, cuda=device_is_cuda,
                                            quantized=policy.kv_dtype is not None)
        per_buffer = max(1, min(per_buffer, longest_streamed_run(groups_per_layer, on_device, on_disk)))

    def fits_at(ctx: int) -> bool:
        # Buffers of one group: the most context this configuration holds (a plan there makes them that small).
        _, g, h = _footprint(shape, ctx, chunk, group, resident, device_is_cuda, policy.kv_dtype, activation_bytes)
        h, d, _ = split(ctx, h)
        return _within(g, gpu_budget) and _within(h, host_budget) and _within(d, disk_budget)

    max_ctx = _largest_fitting(fits_at)
    reasons = _refusals(policy, device_is_cuda, breakdown, max_ctx, (gpu, gpu_budget), (host, host_budget),
                        (disk, disk_budget))
    groups = max(shape.groups_per_layer(group))  # (of the layer with the most; each layer's: shape.groups_per_layer)
    window = None if policy.exceed_trained_window else shape.max_positions
    # The first of equal limits is named: the model's window is the one no setting can lift.
    limited_by, limit = min(((name, value) for name, value in ((LIMIT_MODEL, window),
                            (LIMIT_MAX_CONTEXT, policy.max_context), (LIMIT_MEMORY, max_ctx)) if value is not None),
                            key=lambda item: item[1])
    host_gbps, h2d_gbps = (rates.host_attention_gbps, rates.h2d_gbps) if rates is not None else (None, None)
    share, forecast = _decode_split(shape, policy, context_tokens, resident, total_slots, device_is_cuda, host_gbps,
                                    h2d_gbps)
    plan = Plan(context_tokens, chunk, group, groups, resident, total_slots, device_is_cuda,
                breakdown, gpu, host, gpu_budget, host_budget, not reasons, "; ".join(reasons), max_ctx,
                limit, limited_by, disk_bytes=disk, disk_slots=disk_slots, host_attention=policy.host_attention,
                host_share=share, decode_seconds=forecast.seconds, pcie_floor_seconds=forecast.pcie_floor_seconds,
                host_attention_gbps=host_gbps, h2d_gbps=h2d_gbps,
                allocations=planned_allocations(shape, capacity=context_tokens, chunk=chunk, group=group,
                                                resident_slots=resident, disk_slots=disk_slots, cuda=device_is_cuda,
                                                kv_dtype=policy.kv_dtype, host_attention=share > 0,
                                                groups_per_buffer=per_buffer),
                groups_per_buffer=per_buffer)
    plan = with_pinning(plan, machine)  # what is pinned and what the rest costs through the staging ring
    logger.debug("plan: %s", plan.summary().replace("\n", " | "))
    return plan


def _decode_split(shape: ModelShape, policy: OffloadPolicy, context_tokens: int, resident: int, total_slots: int,
                  device_is_cuda: bool, host_gbps: float | None, h2d_gbps: float | None):
    """(host share, DecodeForecast) of a decode step at ``context_tokens``: the offloaded bytes it reads, split."""
    # each layer's K and V in host homes: 8-bit codes (and their scales) are what the link and the host kernel read
    per_token = host_layer_token_bytes(shape, policy.kv_dtype)
    read = sum(b * (context_tokens if w is None else min(w, context_tokens))
               for b, w in zip(per_token, shape.sliding_windows))
    offloaded = 1 - resident / total_slots  # resident slots are spread evenly over the layers
    offloaded_bytes = round(offloaded * read)
    quantized = policy.kv_dtype is not None
    balance = host_share(policy.host_attention, device_is_cuda, host_gbps, h2d_gbps, quantized=quantized)
    # The layers that wait for the host: choose_host_slots spreads the host's slots over the layers (a share of
    # many groups a layer puts some in every layer; one group a layer, alternate layers), resident ones never wait.
    offloaded_slots = total_slots - resident
    host_layers = min(shape.num_layers, offloaded_slots, round(balance * offloaded_slots)) if device_is_cuda else 0
    share = host_share(policy.host_attention, device_is_cuda, host_gbps, h2d_gbps, quantized=quantized,
                       offloaded_bytes=offloaded_bytes if device_is_cuda else None, host_layers=host_layers)
    return share, forecast_decode(offloaded_bytes, share, host_gbps, h2d_gbps, host_layers=host_layers)


def _disk_budget(policy: OffloadPolicy) -> int | None:
    if policy.disk_dir is None:
        return None
    if policy.disk_memory is not None:
        return policy.disk_memory

    folder = Path(policy.disk_dir).expanduser()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def _kv_stored(shape: ModelShape, context: int, chunk: int, kv_dtype: str | None) -> int:
    return stored_kv_bytes(shape, context, chunk, kv_dtype)


def _split_disk(host: int, kv_host: int, slots: int, host_budget: int | None) -> tuple[int, int, int]:
    """(host bytes, disk bytes, disk slots): whole slots of the ``kv_host`` KV bytes in RAM (over ``slots`` homes)
    move to the disk tier until the rest fits ``host_budget``."""
    if host_budget is None or host <= host_budget or slots == 0 or kv_host == 0:
        return host, 0, 0
    per_slot = kv_host / slots
    moved = min(slots, math.ceil((host - host_budget) / per_slot))
    disk = int(moved * per_slot)
    return host - disk, disk, moved


def _largest_fitting(fits_at) -> int:
    """Largest context in [0, 2**31] for which ``fits_at`` holds (memory grows with context)."""
    if not fits_at(1):
        return 0
    if fits_at(MAX_CONTEXT):
        return MAX_CONTEXT
    lo, hi = 1, MAX_CONTEXT  # fits_at(lo) and not fits_at(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits_at(mid) else (lo, mid)
    return lo


def paper_memory_table(shape: ModelShape, context_tokens: int, chunk_size: int = 10240) -> dict[str, dict[str, float]]:
    """The paper's appendix memory table (GiB) for five inference strategies.

    Uses the paper's formulas verbatim (no sliding windows, no logits), so that
    Llama-3-8B at 1M tokens reproduces 207 / 143 / 111 / 87 / 16.7 GiB totals.
    """
    if context_tokens < 1 or chunk_size < 1:
        raise PlanError("context_tokens and chunk_size must be positive")
    weights = shape.weights_bytes
    kv_full = context_tokens * shape.kv_bytes_per_token
    per_token_act = (shape.hidden_size + 2 * shape.intermediate_size) * shape.dtype_bytes
    act_full, act_chunk = context_tokens * per_token_act, min(chunk_size, context_tokens) * per_token_act
    head_layer = context_tokens * shape.head_dim * 2 * shape.dtype_bytes  # one head of one layer, K+V
    rows = {  # (kv on gpu, activations, total kv)
        "standard": (kv_full, act_full, kv_full),
        "chunked_prefill": (kv_full, act_chunk, kv_full),
        "kv_quant_4bit": (kv_full / 4, act_full, kv_full / 4),
        "layerwise_offload": (2 * shape.num_kv_heads * head_layer, act_full, kv_full),  # ping-pong layers
        "headinfer": (2 * head_layer, act_chunk, kv_full),  # ping-pong single heads
    }
    return {
        name: {"weights": weights / GIB, "kv_gpu": kv / GIB, "activation": act / GIB,
               "total": (weights + kv + act) / GIB, "kv_total": total_kv / GIB}
        for name, (kv, act, total_kv) in rows.items()
    }
