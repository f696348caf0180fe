"""The ``"headinfer"`` attention implementation: head-group by head-group over an offloaded KV cache.

Registered with transformers' ``AttentionInterface`` (and a matching ``AttentionMaskInterface`` entry that
never materialises a query x key mask) by ``import engine``. The schedule for one layer is one loop:

    for each head group g of the layer:
        K/V of g  <- a view of its device home, or the ping-pong buffer fetched for it (waits for the copy)
        start fetching the next offloaded group (next layer's first one at the layer's end) into the other buffer
        attend(queries of g, K/V of g) -> output heads of g
        mark g's buffer free once the compute stream is done with it
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from . import kernels

if TYPE_CHECKING:
    from .cache import HeadInferLayer

logger = logging.getLogger(__name__)

ATTENTION_NAME = "headinfer"
_LAYER_ATTR = "_headinfer_layer"  # set by HeadInferLayer.update on the key tensor it hands to the model


def mark_chunk(key: torch.Tensor, layer: "HeadInferLayer") -> None:
    """Tags the key states a cache layer returns, so the attention function finds the layer's store."""
    setattr(key, _LAYER_ATTR, layer)


def visible_start(past: int, window: int | None) -> int:
    """First key a chunk starting at position ``past`` can see: with window W, query t sees keys > t - W."""
    return 0 if window is None else max(0, past - window + 1)


def headinfer_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention function. query: [B, H, Q, D]; key/value: [B, KVH, K, D]. Returns ([B, Q, H, D], None).

    With a ``HeadInferCache`` the key/value are this chunk only and the past comes from the cache's homes;
    with any other cache (or none) they are the full visible keys and the same kernels run on them directly.
    """
    if attention_mask is not None:
        raise ValueError(
            "headinfer attention does not support padded batches (an attention mask with zeros); "
            "run sequences of equal length or one at a time"
        )
    if dropout:
        raise ValueError("headinfer attention is for inference: dropout must be 0 (call model.eval())")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    layer = getattr(key, _LAYER_ATTR, None)
    if layer is None:
        q_offset = key.shape[2] - query.shape[2]
        return kernels.attend(query, key, value, q_offset=q_offset, scaling=scaling,
                              window=sliding_window, softcap=softcap), None
    return headwise_attention(layer, query, key, value, scaling=scaling, window=sliding_window, softcap=softcap), None


def headwise_attention(layer: "HeadInferLayer", query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       *, scaling: float, window: int | None, softcap: float | None) -> torch.Tensor:
    """One layer of head-wise attention. key/value: this chunk [B, KVH, Q, D], already written to the homes."""
    batch, num_heads, q_len, head_dim = query.shape
    num_kv_heads = key.shape[1]
    n_rep = num_heads // num_kv_heads
    cache = layer.cache
    past = layer.length - q_len
    start = visible_start(past, window)
    out = query.new_empty(batch, q_len, num_heads, head_dim)
    for group_idx, home in enumerate(layer.store.homes):
        group = home.group
        buffer = None
        if group.is_resident:
            group_keys, group_values = home.view(start, past + q_len)  # [B, g, K, D], includes this chunk
        else:
            slot = (layer.layer_idx, group_idx)
            buffer = cache.transfer.acquire(slot, home, start, past, past - start + q_len)
            group_keys, group_values = cache.transfer.buffer_with_chunk(
                buffer, group.size, past - start, key, value, slice(group.start, group.stop))
        if cache.policy.overlap:
            cache.prefetch_after(layer.layer_idx, group_idx, past, q_len)
        heads = slice(group.start * n_rep, group.stop * n_rep)
        out[:, :, heads] = kernels.attend(query[:, heads], group_keys, group_values, q_offset=past - start,
                                          scaling=scaling, window=window, softcap=softcap)
        if buffer is not None:
            cache.transfer.release(buffer)
    return out


def headinfer_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                   mask_function=None, attention_mask: torch.Tensor | None = None, **kwargs) -> None:
    """Mask hook: causal and sliding-window masks are applied inside the kernels, so none is ever built.

    A 2D padding mask with zeros cannot be honoured without a mask, so it is refused here, early and clearly.
    """
    if attention_mask is not None and attention_mask.ndim == 2 and not bool(attention_mask[:, -kv_length:].all()):
        raise ValueError(
            "headinfer attention does not support padded batches (attention_mask has zeros); "
            "run sequences of equal length or one at a time"
        )
    return None


def register() -> None:
    """Registers ``"headinfer"`` with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, headinfer_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, headinfer_mask)
