"""Attention over one head group: bottom-right causal, sliding window, softcap, GQA.

One entry point, ``attend``, picks the kernel:
- flash-attn when it is installed and the tensors are fp16/bf16 on CUDA (native bottom-right causal,
  window and softcap, GQA without repeating K/V);
- torch SDPA otherwise, with a lower-right causal bias that CUDA kernels apply without building a mask;
- an exact blockwise softmax in plain torch for logit softcapping (Gemma 2), which SDPA cannot express.

Index convention: keys are ``K = q_offset + Q`` consecutive positions; query ``i`` sits at key position
``q_offset + i`` and sees key ``j`` iff ``j <= q_offset + i`` and, with a window ``W``,
``j > q_offset + i - W`` (the same rule as transformers' ``sliding_window_overlay``).
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

logger = logging.getLogger(__name__)

# Keys per tile of the blockwise softcap path: bounds its score matrix to [heads, Q, tile].
_SOFTCAP_TILE = 8192


@functools.cache
def _flash_attn_func():
    try:
        from flash_attn import flash_attn_func
    except ImportError:
        return None
    logger.info("flash-attn found: using its kernels on CUDA")
    return flash_attn_func


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    q_offset: int,
    scaling: float,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Exact attention of a query block against its visible keys.

    query: [B, Hq, Q, D]; key/value: [B, Hk, K, D] with Hq a multiple of Hk and K = q_offset + Q.
    Returns [B, Q, Hq, D] (the layout transformers expects back from an attention function).
    """
    batch, num_q_heads, q_len, head_dim = query.shape
    num_k_heads, k_len = key.shape[1], key.shape[2]
    assert k_len == q_offset + q_len, (k_len, q_offset, q_len)
    assert num_q_heads % num_k_heads == 0, (num_q_heads, num_k_heads)

    flash = _flash_attn_func()
    if flash is not None and query.is_cuda and query.dtype in (torch.float16, torch.bfloat16):
        out = flash(
            query.transpose(1, 2),
            key.transpose(1, 2),
            value.transpose(1, 2),
            softmax_scale=scaling,
            causal=True,  # flash-attn aligns causal masks bottom-right, as a chunk against its past needs
            window_size=(window - 1, 0) if window else (-1, -1),
            softcap=softcap or 0.0,
        )
        return out  # [B, Q, Hq, D]
    if softcap:
        return _blockwise_softcap(query, key, value, q_offset, scaling, window, softcap)
    return _sdpa(query, key, value, q_offset, scaling, window)


def _sdpa(query, key, value, q_offset, scaling, window):
    batch, num_q_heads, q_len, head_dim = query.shape
    num_k_heads, k_len = key.shape[1], key.shape[2]
    n_rep = num_q_heads // num_k_heads
    needs_window_mask = window is not None and k_len > window
    if q_len == 1 and not needs_window_mask:
        # Decode: every key is visible, so no mask at all. Fold the query heads that share a KV head into
        # the query axis ([B, Hk, n_rep, D]) so K/V are read once per KV head, never repeated.
        folded = query.reshape(batch, num_k_heads, n_rep, head_dim)
        out = F.scaled_dot_product_attention(folded, key, value, scale=scaling)
        return out.reshape(batch, num_q_heads, 1, head_dim).transpose(1, 2)
    if needs_window_mask:
        # Only reached with keys already cut to the window's reach, so this mask is [Q, < Q + W].
        mask = _visibility_mask(q_len, k_len, q_offset, window, query.device)
    elif q_len == k_len:
        mask = None
    else:
        mask = causal_lower_right(q_len, k_len)
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, is_causal=mask is None, scale=scaling, enable_gqa=n_rep > 1
    )
    return out.transpose(1, 2)


def _visibility_mask(q_len, k_len, q_offset, window, device):
    q_pos = torch.arange(q_len, device=device)[:, None] + q_offset
    k_pos = torch.arange(k_len, device=device)[None, :]
    mask = k_pos <= q_pos
    if window is not None:
        mask &= k_pos > q_pos - window
    return mask  # [Q, K] bool, True = attend


def _blockwise_softcap(query, key, value, q_offset, scaling, window, softcap):
    """softmax(softcap * tanh(q k^T * scale / softcap)) v, tiled over keys with a running max and sum.

    Mirrors transformers' eager attention (scores and softmax in fp32) so Gemma 2 stays exact, while the
    largest intermediate is [B, Hq, Q, tile] rather than [B, Hq, Q, K].
    """
    batch, num_q_heads, q_len, head_dim = query.shape
    num_k_heads, k_len = key.shape[1], key.shape[2]
    n_rep = num_q_heads // num_k_heads
    q = query.reshape(batch, num_k_heads, n_rep * q_len, head_dim)  # fold GQA rows: [B, Hk, n_rep*Q, D]
    running_max = torch.full((batch, num_k_heads, n_rep * q_len, 1), float("-inf"), device=q.device)
    running_sum = torch.zeros_like(running_max)
    acc = torch.zeros(batch, num_k_heads, n_rep * q_len, head_dim, device=q.device, dtype=torch.float32)
    for start in range(0, k_len, _SOFTCAP_TILE):
        stop = min(start + _SOFTCAP_TILE, k_len)
        scores = torch.matmul(q, key[:, :, start:stop].transpose(2, 3)) * scaling
        scores = torch.tanh(scores / softcap) * softcap
        visible = _visibility_mask(q_len, k_len, q_offset, window, q.device)[:, start:stop].repeat(n_rep, 1)
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
    return out.reshape(batch, num_q_heads, q_len, head_dim).transpose(1, 2)
