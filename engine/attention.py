"""The ``"headinfer"`` attention implementation registered with transformers.

``import engine`` registers it with ``AttentionInterface`` (and a matching ``AttentionMaskInterface`` entry
that never materialises a query x key mask). The function only attends: with a ``HeadInferCache`` it takes
its layer from the KV route (``kv/route.py``) and the cache's schedule reads the past group by group; with
any other cache (or none) the key/value are the full visible keys and the same kernels run on them.
"""

from __future__ import annotations

import logging

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from .errors import InputError
from .kv import kernels, route

logger = logging.getLogger(__name__)

ATTENTION_NAME = "headinfer"
_PADDED = ("headinfer attention does not support padded batches (an attention mask with zeros); "
           "run sequences of equal length or one at a time")


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
    """transformers attention function. query: [B, H, Q, D]; key/value: [B, KVH, K, D]. Returns ([B, Q, H, D], None)."""
    if attention_mask is not None:
        raise InputError(_PADDED)
    if dropout:
        raise InputError("headinfer attention is for inference: dropout must be 0 (call model.eval())")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    layer = route.take(getattr(module, "layer_idx", None), key)
    if layer is not None:
        return layer.attend(query, key, value, scaling=scaling, window=sliding_window, softcap=softcap), None
    q_offset = key.shape[2] - query.shape[2]
    return kernels.attend(query, key, value, q_offset=q_offset, scaling=scaling,
                          window=sliding_window, softcap=softcap), None


def headinfer_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                   mask_function=None, attention_mask: torch.Tensor | None = None, **kwargs) -> None:
    """Mask hook: causal and sliding-window masks are applied inside the kernels, so none is ever built.

    A 2D padding mask with zeros cannot be honoured without a mask, so it is refused here. Reading a device
    tensor's values synchronises with the device, so the check runs on a forward's first chunk only
    (``kv_length == q_length``: padding sits in the prompt, and generation only appends ones) or when the
    mask is on the CPU anyway; never on a decode step.
    """
    if attention_mask is None or attention_mask.ndim != 2:
        return None
    if attention_mask.device.type == "cpu" or kv_length == q_length:
        if not bool(attention_mask[:, -kv_length:].all()):
            raise InputError(_PADDED)
    return None


def register() -> None:
    """Registers ``"headinfer"`` with transformers (idempotent)."""
    AttentionInterface.register(ATTENTION_NAME, headinfer_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, headinfer_mask)
