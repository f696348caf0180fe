"""Attention over one head group: bottom-right causal, sliding window, softcap, GQA.

Two entry points: ``attend`` takes K/V in transformers' ``[B, Hk, K, D]`` layout, ``attend_span`` takes
a token-major KV block ``[K, B, 2, Hk, D]`` straight from a home or a ping-pong buffer. Both pick a route:

- ``flash-attn`` when installed and the tensors are fp16/bf16 on CUDA (native bottom-right causal, window,
  softcap, GQA without repeating K/V), if its version has what the call needs: 2.1+ at all (older ones align
  the causal mask top-left), 2.3+ for a window, 2.6+ for softcap; otherwise the SDPA routes below;
- ``sdpa-decode``: one query token and every key visible: GQA folded into the query axis, no mask (any SDPA
  backend may run it: its scores are [B, Hk, n_rep, K], a few KB per thousand keys);
- ``window-blocks``: a sliding window shorter than the keys (``windowed.py``): blocks of queries against the
  keys they can see, each with a small additive mask in the query dtype, query heads folded onto their KV head
  (K/V never repeated); on CUDA through SDPA's memory-efficient kernel only, ``tiled-math`` if it refuses;
- ``sdpa-fused`` on CUDA: torch SDPA restricted to its fused kernels (flash, memory-efficient, cuDNN), on a
  contiguous copy of the group's K/V. fp32, which the flash kernel does not take, needs the memory-efficient
  kernel, which has no GQA, so the group's K/V are expanded to the query heads first. A cache hands its
  ``scratch`` (``buffers.Scratch``: one buffer allocated at its planned size) and the copies are views of it;
  without one (attention outside a ``HeadInferCache``) each call allocates them. If no fused kernel accepts
  the call, ``tiled-math`` runs instead;
- ``tiled-math``: exact softmax over key tiles with a running max (plain torch), whose largest
  intermediate is ``[B, Hq, Q, tile]``: logit softcapping (Gemma 2), and the fallback above;
- ``sdpa-cpu``: causal torch SDPA on the CPU (GQA without repeating K/V, no mask beyond a lower-right bias);
- ``cpu-native``: a CPU step of at most ``native.CPU_QUERY_LIMIT`` fp32 queries over a token-major span (decode
  on a CPU device): the C tile of ``host_kernel.c`` on this thread, which reads the block once in order (SDPA
  reads its keys with a stride, slower: docs/benchmarks/host-attention-cpu.md, Notes from the code). Masks,
  windows and softcap are applied inside, in fp32 like SDPA.
  Not for bf16/fp16 queries: torch's CPU SDPA multiplies the values by probabilities rounded to bf16, taken with
  its own approximate exp, and greedy tokens of a bf16 model must stay those of stock transformers (an fp32 tile
  differed from it in a fifth of a decode step's outputs, and two tiny bf16 models then chose other tokens);
- ``cpu-native-pool``: the same kernel on its own thread pool, for blocks of ``POOL_BYTES`` and more when torch
  runs several threads;
- ``cpu-native-prefill``: a longer fp32 query block on a CPU (a prefill chunk) through the same kernel, a call per
  ``PREFILL_QUERY_BLOCK`` queries over the keys they see, on the pool (docs/benchmarks/prefill-attention.md).

SDPA's math kernel is never allowed on CUDA: it materialises ``[heads, chunk, keys]`` scores that the memory plan
does not count (docs/benchmarks/windowed-attention.md).

Index convention: keys are ``K = q_offset + Q`` consecutive positions; query ``i`` sits at key position
``q_offset + i`` and sees key ``j`` iff ``j <= q_offset + i`` and, with a window ``W``,
``j > q_offset + i - W`` (the same rule as transformers' ``sliding_window_overlay``).
"""

from __future__ import annotations

import collections
import functools
import logging
import re

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from . import native, windowed
from .buffers import contiguous_kv
from ..native.workers import usable_cores

logger = logging.getLogger(__name__)

# Keys per tile of the tiled path: bounds its score matrix to [B, Hq, Q, tile]; queries are blocked so that one
# fp32 tile stays within SCORE_TILE_BYTES. A tile step holds at most TILED_LIVE_TILES such tiles at once (scores,
# their softcapped and masked copies, the probabilities): what the planner counts for it.
_TILE = 8192
SCORE_TILE_BYTES = 64 << 20
TILED_LIVE_TILES = 4
_FUSED = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
# The windowed route's masks go to the memory-efficient kernel only: it takes them as they are (rows padded to
# 16), fp32 included, where cuDNN's handling of a bias is not one we have measured (windowed.scratch_bytes).
_WINDOW_FUSED = [SDPBackend.EFFICIENT_ATTENTION]
_NO_KERNEL = ("No available kernel", "No viable backend")  # what SDPA raises on CUDA / elsewhere
#: Device types whose prefill attention runs the fused routes on contiguous K/V copies (``sdpa-fused``, and
#: ``window-blocks`` through the memory-efficient kernel): where a cache allocates its scratch and the planner
#: counts it. A seam: tests add "cpu" to run these routes and their scratch on a CPU (CPU SDPA takes them).
FUSED_DEVICES = frozenset({"cuda"})


def copies_kv(device_type: str) -> bool:
    """Whether attention on ``device_type`` copies K/V contiguous (into a cache's scratch): the plan's question."""
    return device_type in FUSED_DEVICES

# How often each route ran in this process (benchmarks record it; the first use of each is logged).
ROUTE_COUNTS: collections.Counter = collections.Counter()


# The first flash-attn releases whose kernels do what we ask of them: a causal mask aligned bottom-right (a chunk
# after the first sees the past; before 2.1 it was aligned top-left), ``window_size`` (2.3), ``softcap`` (2.6).
_FLASH_BOTTOM_RIGHT, _FLASH_WINDOW, _FLASH_SOFTCAP = (2, 1), (2, 3), (2, 6)


@functools.cache
def _flash_attn() -> tuple | None:
    """(flash_attn_func, its version as (major, minor)), or None when it is missing or too old to be exact."""
    try:
        import flash_attn  # optional dependency: flash-attn where installed, else SDPA
        from flash_attn import flash_attn_func
    except ImportError:
        return None
    text = str(getattr(flash_attn, "__version__", "0"))
    version = tuple(int(part) for part in re.findall(r"\d+", text)[:2]) or (0,)
    if version < _FLASH_BOTTOM_RIGHT:
        logger.warning("flash-attn %s aligns its causal mask top-left (every prefill chunk after the first would "
                       "be wrong; fixed in 2.1): not used, attention runs through SDPA", text)
        return None
    logger.info("flash-attn %s found: using its kernels on CUDA", text)
    return flash_attn_func, version


def _flash_attn_func():
    found = _flash_attn()
    return found[0] if found is not None else None


@functools.cache
def _flash_skipped(feature: str, version: tuple) -> None:
    logger.info("flash-attn %s has no %s: attention that needs it runs through SDPA instead",
                ".".join(map(str, version)), feature)


def _can_flash(query: torch.Tensor, k_len: int, window: int | None, softcap: float | None) -> bool:
    """flash-attn only for fp16/bf16 on CUDA, and only where its version has what this call needs."""
    if not (query.is_cuda and query.dtype in (torch.float16, torch.bfloat16)):
        return False
    found = _flash_attn()
    if found is None:
        return False
    version = found[1]
    if window is not None and k_len > window and version < _FLASH_WINDOW:
        _flash_skipped("window_size (2.3+)", version)
        return False
    if softcap and version < _FLASH_SOFTCAP:
        _flash_skipped("softcap (2.6+)", version)
        return False
    return True


def flash_kwargs(k_len: int, scaling: float, window: int | None, softcap: float | None) -> dict:
    """Keyword arguments for ``flash_attn_func``.

    ``softcap`` only when set (flash-attn before 2.6 rejects the argument), and a window only when the keys
    reach beyond it (otherwise it changes nothing and selects a slower kernel variant).
    """
    kwargs = {"softmax_scale": scaling, "causal": True}  # flash-attn aligns causal masks bottom-right
    if window is not None and k_len > window:
        kwargs["window_size"] = (window - 1, 0)
    if softcap:
        kwargs["softcap"] = softcap
    return kwargs


def _route(name: str) -> None:
    if ROUTE_COUNTS[name] == 0:
        logger.info("attention route in use: %s", name)
    ROUTE_COUNTS[name] += 1


def attend_span(query: torch.Tensor, span: torch.Tensor, *, q_offset: int, scaling: float,
                 window: int | None = None, softcap: float | None = None, scratch=None) -> torch.Tensor:
    """query: [B, Hq, Q, D]; span: [K, B, 2, Hk, D] token-major keys (index 0) and values (index 1);
    ``scratch``: the cache's ``buffers.Scratch``, where the fused routes copy K/V (None: they allocate).

    Returns [B, Hq, Q, D].
    """
    if _can_flash(query, span.shape[0], window, softcap):
        _route("flash-attn")
        keys, values = span.transpose(0, 1).unbind(2)  # [B, K, Hk, D] each, what flash-attn reads
        out = _flash_attn_func()(query.transpose(1, 2), keys, values,
                                 **flash_kwargs(span.shape[0], scaling, window, softcap))
        return out.transpose(1, 2)
    if query.device.type == "cpu" and query.dtype == torch.float32:
        if query.shape[2] <= native.CPU_QUERY_LIMIT:
            out = _cpu_tile(query, span, q_offset, scaling, window, softcap)
        elif not copies_kv("cpu"):  # (tests emulating CUDA's fused routes on the CPU keep them)
            out = _cpu_prefill(query, span, q_offset, scaling, window, softcap)
        else:
            out = None
        if out is not None:
            return out
    keys, values = span.permute(2, 1, 3, 0, 4).unbind(0)  # [B, Hk, K, D] each (views)
    return _attend(query, keys, values, q_offset, scaling, window, softcap, scratch)


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, q_offset: int, scaling: float,
           window: int | None = None, softcap: float | None = None) -> torch.Tensor:
    """Exact attention of a query block against its visible keys.

    query: [B, Hq, Q, D]; key/value: [B, Hk, K, D] with Hq a multiple of Hk and K = q_offset + Q.
    Returns [B, Q, Hq, D] (the layout transformers expects back from an attention function).
    """
    if _can_flash(query, key.shape[2], window, softcap):
        _route("flash-attn")
        return _flash_attn_func()(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                  **flash_kwargs(key.shape[2], scaling, window, softcap))
    return _attend(query, key, value, q_offset, scaling, window, softcap).transpose(1, 2)


def _cpu_tile(query, block, q_offset, scaling, window, softcap) -> torch.Tensor | None:
    """A CPU decode step over a token-major span through the C kernel: on this thread, or on the kernel's pool
    where the block is large and torch may use several threads; None: no C kernel for it here."""
    is_pooled = torch.get_num_threads() > 1 and block.nbytes >= POOL_BYTES
    out = native.attend_span(query, block, q_offset=q_offset, scaling=scaling, window=window, softcap=softcap,
                              num_threads=min(torch.get_num_threads(), usable_cores()) if is_pooled else 1)
    if out is not None:
        _route("cpu-native-pool" if is_pooled else "cpu-native")
    return out


def _cpu_prefill(query, block, q_offset, scaling, window, softcap) -> torch.Tensor | None:
    """A CPU prefill chunk (more than ``native.CPU_QUERY_LIMIT`` fp32 queries) through the C kernel,
    ``PREFILL_QUERY_BLOCK`` query tokens a call, each call over the keys its queries see (causality and a window
    cut the rest), on the kernel's pool; None: no C kernel for it here.

    Why: about twice torch's CPU SDPA on a prefill chunk, exact to fp32 rounding, and attention is most of a long
    prefill (``docs/benchmarks/prefill-attention.md``)."""
    if not native.can_attend(query, [block]):
        return None
    assert block.shape[0] == q_offset + query.shape[2], (block.shape, q_offset, query.shape)
    batch, num_heads, q_len, head_dim = query.shape
    num_threads = min(torch.get_num_threads(), usable_cores())
    # A call's tasks each keep a partial of every row (B * H * block rows of D + 2 floats): tiles of at least 16
    # partials' bytes keep that scratch within 1/16 of the home however long the context.
    tile_bytes = max(2 << 20, 16 * batch * num_heads * PREFILL_QUERY_BLOCK * (head_dim + 2) * 4)
    out = torch.empty(batch, num_heads, q_len, head_dim)  # [B, H, Q, D]
    for first in range(0, q_len, PREFILL_QUERY_BLOCK):
        last = min(first + PREFILL_QUERY_BLOCK, q_len)
        start = 0 if window is None else max(0, q_offset + first - window + 1)  # the first query's oldest key
        # written in place through its strides: a torch copy between the calls woke torch's OpenMP threads, whose
        # spinning then took the second core from the kernel's pool (2 cores, 8K keys: 210 against 310 GFLOPS)
        native.attend_layer(query[:, :, first:last], [block], start, q_offset + last, out[:, :, first:last],
                            scaling=scaling, window=window, softcap=softcap, num_threads=num_threads,
                            tile_bytes=tile_bytes)
    _route("cpu-native-prefill")
    return out


#: Query tokens per C call of a CPU prefill chunk: 32-128 ran alike (a 512-token chunk over 2K-32K keys, 1 and 2
#: threads); a whole chunk in one call 5-15% slower (every row's partials kept per task and merged), 10-40% at the
#: first chunk.
PREFILL_QUERY_BLOCK = 64


#: Block bytes from which a CPU decode step runs on the kernel's pool: below it handing half to another core costs
#: more than it saves (docs/benchmarks/pool-bytes-shared.md; before ``share_pool``, docs/benchmarks/pool-bytes.md).
POOL_BYTES = 1 << 20


def _attend(query, key, value, q_offset, scaling, window, softcap, scratch=None) -> torch.Tensor:
    """[B, Hq, Q, D] x [B, Hk, K, D] -> [B, Hq, Q, D], without flash-attn."""
    batch, num_q_heads, q_len, head_dim = query.shape
    num_k_heads, k_len = key.shape[1], key.shape[2]
    assert k_len == q_offset + q_len, (k_len, q_offset, q_len)
    assert num_q_heads % num_k_heads == 0, (num_q_heads, num_k_heads)
    n_rep = num_q_heads // num_k_heads
    if softcap:
        _route("tiled-math")
        return _tiled(query, key, value, q_offset, scaling, window, softcap)
    fused = copies_kv(query.device.type)
    needs_window_mask = window is not None and k_len > window
    if needs_window_mask:
        return _windowed(query, key, value, q_offset, scaling, window, fused, scratch)
    if q_len == 1:
        # Decode: every key is visible, so no mask at all. Fold the query heads that share a KV head into
        # the query axis ([B, Hk, n_rep, D]) so K/V are read once per KV head, never repeated.
        _route("sdpa-decode")
        folded = query.reshape(batch, num_k_heads, n_rep, head_dim)
        out = F.scaled_dot_product_attention(folded, key, value, scale=scaling)
        return out.reshape(batch, num_q_heads, 1, head_dim)
    if not fused:
        _route("sdpa-cpu")
        return _sdpa(query, key, value, q_offset, scaling, window, n_rep)
    return _sdpa_fused(query, key, value, q_offset, scaling, window, n_rep, scratch)


def _windowed(query, key, value, q_offset, scaling, window, fused: bool, scratch=None):
    """A sliding window shorter than the keys: query blocks against their visible keys (``windowed``); ``fused``
    (CUDA): through SDPA's memory-efficient kernel only, on contiguous K/V (in ``scratch`` when given),
    ``tiled-math`` if it refuses the call."""
    if not fused:
        _route("window-blocks")
        return windowed.attend(query, key, value, q_offset, scaling, window)
    try:
        with sdpa_kernel(_WINDOW_FUSED):
            out = windowed.attend(query, key, value, q_offset, scaling, window, contiguous=True, scratch=scratch)
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as error:
        if not any(text in str(error) for text in _NO_KERNEL):
            raise
        logger.debug("no fused SDPA kernel for windowed %s %s (%s)", tuple(query.shape), query.dtype, error)
        _route("tiled-math")
        return _tiled(query, key, value, q_offset, scaling, window, None)
    _route("window-blocks")
    return out


def _sdpa(query, key, value, q_offset, scaling, window, n_rep):
    """Causal SDPA over every key (a window, if any, reaches past none of them: ``_windowed`` takes those)."""
    q_len, k_len = query.shape[2], key.shape[2]
    assert window is None or k_len <= window, (k_len, window)
    mask = None if q_len == k_len else causal_lower_right(q_len, k_len)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=mask is None,
                                          scale=scaling, enable_gqa=n_rep > 1)


def _sdpa_fused(query, key, value, q_offset, scaling, window, n_rep, scratch=None):
    """CUDA prefill through SDPA's fused kernels only; ``tiled-math`` if none of them takes the call."""
    # Token-major views have strides the memory-efficient kernel is not known to handle (pytorch#112577): a
    # contiguous copy of one group's K/V is cheap next to the attention itself. The memory-efficient kernel (the
    # only fused one for fp32) has no GQA: there the copy repeats the group's K/V for its query heads.
    expand = n_rep if n_rep > 1 and query.dtype == torch.float32 else 1
    key, value = contiguous_kv(key, value, expand, scratch)  # [B, Hk * expand, K, D] each
    n_rep //= expand
    try:
        with sdpa_kernel(_FUSED):
            out = _sdpa(query, key, value, q_offset, scaling, window, n_rep)
    except torch.OutOfMemoryError:
        raise  # the tiled fallback needs more memory, not less
    except RuntimeError as error:
        if not any(text in str(error) for text in _NO_KERNEL):
            raise
        # Never let it fall to the math kernel and its [heads, chunk, keys] scores.
        logger.debug("no fused SDPA kernel for %s %s (%s)", tuple(query.shape), query.dtype, error)
        _route("tiled-math")
        return _tiled(query, key, value, q_offset, scaling, window, None)
    _route("sdpa-fused")
    return out


def _visibility_mask(q_len, q_offset, window, k_start, k_stop, device):
    """[Q, k_stop - k_start] bool, True = attend, for the keys [k_start, k_stop) only."""
    q_pos = torch.arange(q_len, device=device)[:, None] + q_offset
    k_pos = torch.arange(k_start, k_stop, device=device)[None, :]
    mask = k_pos <= q_pos
    if window is not None:
        mask &= k_pos > q_pos - window
    return mask


def query_block(batch: int, num_q_heads: int, q_len: int, k_tile: int = _TILE) -> int:
    """Query tokens per block of the tiled path: one fp32 score tile [B, Hq, block, k_tile] within
    ``SCORE_TILE_BYTES`` (the planner counts ``TILED_LIVE_TILES`` of them)."""
    return max(1, min(q_len, SCORE_TILE_BYTES // (4 * batch * num_q_heads * min(k_tile, _TILE))))


def _tiled(query, key, value, q_offset, scaling, window, softcap):
    """``_tiled_keys`` over blocks of queries: each block sees only its visible keys (causal: up to its last
    query), and its score tile stays within ``SCORE_TILE_BYTES`` whatever the chunk size."""
    batch, num_q_heads, q_len, _ = query.shape
    block = query_block(batch, num_q_heads, q_len, key.shape[2])
    if block >= q_len:
        return _tiled_keys(query, key, value, q_offset, scaling, window, softcap)
    outs = []
    for first in range(0, q_len, block):
        last = min(first + block, q_len)
        visible = q_offset + last  # keys [0, visible): a sliding window reads fewer, masked inside
        outs.append(_tiled_keys(query[:, :, first:last], key[:, :, :visible], value[:, :, :visible],
                                q_offset + first, scaling, window, softcap))
    return torch.cat(outs, dim=2)  # [B, Hq, Q, D]


def _tiled_keys(query, key, value, q_offset, scaling, window, softcap):
    """softmax(cap(q k^T * scale)) v, tiled over keys with a running max and sum; cap = softcap * tanh(x / softcap).

    Mirrors transformers' eager attention (scores and softmax in fp32) so Gemma 2 stays exact, while the
    largest intermediate is [B, Hq, Q, tile] rather than [B, Hq, Q, K]; each tile builds only its own mask.
    """
    batch, num_q_heads, q_len, head_dim = query.shape
    num_k_heads, k_len = key.shape[1], key.shape[2]
    n_rep = num_q_heads // num_k_heads
    q = query.reshape(batch, num_k_heads, n_rep * q_len, head_dim)  # fold GQA rows: [B, Hk, n_rep*Q, D]
    running_max = torch.full((batch, num_k_heads, n_rep * q_len, 1), float("-inf"), device=q.device)
    running_sum = torch.zeros_like(running_max)
    acc = torch.zeros(batch, num_k_heads, n_rep * q_len, head_dim, device=q.device, dtype=torch.float32)
    for start in range(0, k_len, _TILE):
        stop = min(start + _TILE, k_len)
        scores = torch.matmul(q, key[:, :, start:stop].transpose(2, 3)) * scaling
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        visible = _visibility_mask(q_len, q_offset, window, start, stop, q.device).repeat(n_rep, 1)
        scores = scores.float().masked_fill(~visible, float("-inf"))
        tile_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))
        # A row that has seen no visible key yet keeps max = -inf; exp(-inf - -inf) would be NaN.
        safe_max = torch.where(torch.isinf(tile_max), torch.zeros_like(tile_max), tile_max)
        probs = torch.exp(scores - safe_max)
        correction = torch.exp(running_max - safe_max)
        running_sum = running_sum * correction + probs.sum(dim=-1, keepdim=True)
        acc = acc * correction + torch.matmul(probs.to(value.dtype), value[:, :, start:stop]).float()
        running_max = tile_max
    out = (acc / running_sum).to(query.dtype)  # [B, Hk, n_rep*Q, D]
    return out.reshape(batch, num_q_heads, q_len, head_dim)
