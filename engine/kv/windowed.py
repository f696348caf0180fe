"""Sliding-window attention of a chunk without flash-attn, by query blocks (the ``window-blocks`` route).

Handing SDPA the whole chunk needs a ``[Q, K]`` mask over every key the chunk touches: torch turns a boolean mask
into an additive copy in the query dtype, CUDA's memory-efficient kernel pads that copy to a multiple of 16 keys,
and that kernel has no GQA, so K/V were repeated for the query heads: hundreds of MiB a group on an H200, none of it
in the plan (docs/benchmarks/windowed-attention.md).

Here the chunk's queries go in blocks of ``query_block`` tokens. A block at positions ``[p, p + b)`` reads only
the keys its queries can see, ``[max(0, p - W + 1), p + b)``, with an additive mask of
``[n_rep * b, keys]`` in the query dtype (0 or -inf: the band of the window), built once per block shape with its
rows padded to 16 elements, so SDPA neither converts nor pads it. The query heads that share a KV head are folded
into the query axis (``[B, Hk, n_rep * b, D]``), so K/V are never repeated. On CUDA a block's K/V are copied
contiguous, into the cache's scratch buffer where there is one (``buffers.Scratch``, counted by the ledger).
``scratch_bytes`` is what one call holds besides its output and that buffer; the planner counts it. A block also
computes fewer scores than the whole chunk did (its keys are at most ``W + b - 1``, not ``W + Q - 1``).

Exact: each query row's softmax runs over the same visible keys as transformers' ``sliding_window_overlay``.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from ..native.library import cpu_identity
from .buffers import contiguous_kv

#: One block's additive mask, [n_rep * block, keys] in the query dtype: what bounds the block size.
MASK_BYTES = 8 << 20
#: Mask rows are padded to this many elements: CUDA's memory-efficient kernel copies a mask whose row stride is
#: not a multiple of 16 (``pad_bias`` in torch), which is the copy this module exists to avoid.
_ROW_ALIGN = 16
#: Boolean [block, keys] temporaries alive at once while a mask is built (the two comparisons).
_BOOL_TEMPORARIES = 2


def _padded(keys: int) -> int:
    return -(-keys // _ROW_ALIGN) * _ROW_ALIGN


def query_block(n_rep: int, window: int, dtype_bytes: int, q_len: int) -> int:
    """Queries per block: the most whose mask ``[n_rep * b, pad(b + W - 1)]`` stays within ``MASK_BYTES``."""
    elements = MASK_BYTES // (n_rep * dtype_bytes)  # of one query head's b rows: b * pad(b + W - 1) at most
    block = int((math.sqrt((window - 1) ** 2 + 4 * elements) - (window - 1)) / 2)
    while block > 1 and block * _padded(block + window - 1) > elements:
        block -= 1
    return max(1, min(q_len, block))


def scratch_bytes(batch: int, num_q_heads: int, num_k_heads: int, head_dim: int, window: int, q_len: int,
                  dtype_bytes: int, cuda: bool, cpu_threads: int = 1, kv_in_scratch: bool = False) -> int:
    """The most bytes one ``attend`` call holds besides its output: the block's mask, plus the larger of what
    builds it (two booleans) and what attends with it (the folded query block, SDPA's output and log-sum-exp for
    it, and on CUDA the block's K/V made contiguous (unless ``kv_in_scratch``: a cache's scratch buffer holds
    them) and the kernel's fp32 output accumulator, on the CPU the per-thread buffers of torch's flash kernel for
    ``cpu_threads`` threads)."""
    n_rep = num_q_heads // num_k_heads
    block = query_block(n_rep, window, dtype_bytes, q_len)
    keys = block + window - 1  # the most a block reads (fewer in the first window)
    rows = batch * num_q_heads * block  # folded query rows of one block
    mask = n_rep * block * _padded(keys) * dtype_bytes
    build = _BOOL_TEMPORARIES * block * keys + 8 * (keys + 2 * block)  # and the int64 positions compared
    attend = 2 * rows * head_dim * dtype_bytes + rows * 4  # folded queries, their output, fp32 log-sum-exp
    if cuda:
        attend += rows * head_dim * 4
        if not kv_in_scratch:
            attend += 2 * batch * num_k_heads * keys * head_dim * dtype_bytes
    else:
        attend += cpu_threads * _cpu_flash_thread_bytes(n_rep * block, keys, head_dim, dtype_bytes)
        if dtype_bytes < 4 and cpu_packs_reduced():
            attend += _cpu_flash_pack_bytes(batch * num_k_heads, keys, head_dim, dtype_bytes, cpu_threads)
    return mask + max(build, attend)


def _cpu_flash_thread_bytes(q_len: int, k_len: int, head_dim: int, dtype_bytes: int) -> int:
    """One thread's buffers in torch's CPU flash attention (``FlashAttentionKernel.cpp``): an fp32 score tile of
    at most 256 x 512, its row max and sum, an fp32 output tile, and a reduced-precision copy of the scores."""
    q_split, k_split = min(q_len, 256), min(k_len, 512)
    buffers = (q_split * k_split + 2 * q_split + q_split * head_dim) * 4
    return buffers + (q_split * k_split * dtype_bytes if dtype_bytes < 4 else 0)


#: torch's CPU flash kernel packs K/V for AMX in blocks of this many keys (and head dims): ``packb_size``.
_PACK_BLOCK = 64


def _cpu_flash_pack_bytes(kv_heads: int, k_len: int, head_dim: int, dtype_bytes: int, cpu_threads: int) -> int:
    """What torch's CPU flash kernel adds where it packs bf16/fp16 K/V for AMX tiles: every KV head's keys and
    values reordered into copies (keys and head dim rounded up to ``_PACK_BLOCK``), and per thread a value block of
    512 keys and a transposed key block being packed; none of them on a CPU without AMX (measured:
    docs/benchmarks/windowed-attention.md, Notes from the code)."""
    keys, dim = -(-k_len // _PACK_BLOCK) * _PACK_BLOCK, -(-head_dim // _PACK_BLOCK) * _PACK_BLOCK
    return (2 * kv_heads * keys * dim + cpu_threads * (512 + head_dim) * dim) * dtype_bytes


@functools.cache
def cpu_packs_reduced() -> bool:
    """Whether this CPU has AMX tiles for bf16 or fp16, with which torch's CPU flash kernel packs K/V (from its CPU
    flags; where none can be read, assumed, so that a plan errs by a few MiB rather than short)."""
    identity = cpu_identity()
    if "flags" not in identity:
        return True
    words = identity.split()
    return "amx_bf16" in words or "amx_fp16" in words


def _band(n_rep: int, block: int, first_key: int, num_keys: int, window: int, dtype, device) -> torch.Tensor:
    """[n_rep * block, num_keys] additive mask (rows padded in storage): query ``i`` of the block sits at key index
    ``first_key + i`` of the block's keys and sees ``j`` iff ``first_key + i - W < j <= first_key + i``."""
    bias = torch.full((n_rep, block, _padded(num_keys)), float("-inf"), dtype=dtype, device=device)
    q_pos = torch.arange(block, device=device)[:, None] + first_key
    k_pos = torch.arange(num_keys, device=device)[None, :]
    visible = k_pos <= q_pos
    visible &= k_pos > q_pos - window  # [block, num_keys]
    bias[:, :, :num_keys].masked_fill_(visible, 0.0)
    return bias.view(n_rep * block, -1)[:, :num_keys]  # row stride stays padded: SDPA takes it as it is


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, q_offset: int, scaling: float,
           window: int, *, contiguous: bool = False, scratch=None) -> torch.Tensor:
    """[B, Hq, Q, D] x [B, Hk, K, D] (K = q_offset + Q) -> [B, Hq, Q, D] under a sliding window of ``window``.

    Runs SDPA with whatever backends the caller allows (``kernels`` keeps CUDA to the fused ones).
    ``contiguous``: each block's K/V are copied contiguous first (the fused kernels' need, see
    ``kernels._sdpa_fused``), into views of ``scratch`` when given.
    """
    batch, num_q_heads, q_len, head_dim = query.shape
    num_k_heads = key.shape[1]
    n_rep = num_q_heads // num_k_heads
    block = query_block(n_rep, window, query.element_size(), q_len)
    out = query.new_empty(batch, num_q_heads, q_len, head_dim)
    grouped_out = out.view(batch, num_k_heads, n_rep, q_len, head_dim)
    grouped_query = query.view(batch, num_k_heads, n_rep, q_len, head_dim)
    bias, bias_key = None, None
    for first in range(0, q_len, block):
        last = min(first + block, q_len)
        rows = last - first
        position = q_offset + first
        start = max(0, position - window + 1)
        k, v = key[:, :, start : q_offset + last], value[:, :, start : q_offset + last]  # [B, Hk, keys, D]
        # Every full block past the first window has the same band: built once, reused.
        shape = (rows, position - start, k.shape[2])
        if shape != bias_key:
            bias, bias_key = None, None  # drop the old mask before building the next
            bias, bias_key = _band(n_rep, rows, shape[1], shape[2], window, query.dtype, query.device), shape
        if contiguous:
            # After the mask is built, not before: its boolean temporaries and these copies are never alive
            # together (``scratch_bytes`` counts the larger of the two; copied first, a CUDA Mistral-7B group held
            # 0.3 MiB (fp32) / 1.1 MiB (bf16) more than planned).
            k, v = contiguous_kv(k, v, 1, scratch)
        q = grouped_query[:, :, :, first:last].reshape(batch, num_k_heads, n_rep * rows, head_dim)
        result = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scaling)  # [B, Hk, n_rep * rows, D]
        grouped_out[:, :, :, first:last] = result.view(batch, num_k_heads, n_rep, rows, head_dim)
        del q, k, v, result
    return out
