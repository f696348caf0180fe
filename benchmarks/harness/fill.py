"""Caches filled with random K/V, so decode at 512K tokens is timed without a 512K-token prefill.

Values come from ``torch.randn`` in chunks of tokens generated on the compute device (fast there) and copied
into wherever the cache keeps them; a chunk is one contiguous run per (head, batch row), so host copies are
plain contiguous copies. Zeros are never used: they can run faster than real data.
"""

from __future__ import annotations

import logging

import torch
from transformers import DynamicCache

import engine

logger = logging.getLogger(__name__)

_FILL_TOKENS = 1 << 16  # tokens per random chunk: 16 MiB per head at head_dim 128 in bf16


def fill_random(cache, context: int, *, batch: int = 1, head_dim: int, num_kv_heads: int,
                device: torch.device, dtype: torch.dtype) -> None:
    """Makes ``cache`` hold ``context`` random tokens in every layer, as if a prefill had just ended."""
    if isinstance(cache, engine.HeadInferCache):
        _fill_headinfer(cache, context, batch, head_dim, device, dtype)
    elif isinstance(cache, DynamicCache):
        _fill_dynamic(cache, context, batch, head_dim, num_kv_heads, device, dtype)
    else:
        raise TypeError(f"cannot fill a {type(cache).__name__}")
    logger.debug("filled %s with %d random tokens", type(cache).__name__, context)


def _fill_headinfer(cache, context: int, batch: int, head_dim: int, device: torch.device, dtype: torch.dtype):
    cache.allocate(batch, head_dim, dtype, device)
    cache.reserve(context)
    for layer in cache.kv_layers:  # a hybrid's state layers hold no K/V
        for home in layer.homes:
            if home.is_quantized or home.disk is not None:
                _write_random(home, context, device, dtype)
            else:
                _randomize(home.block(0, context), device)  # [context, B, 2, g, D], one contiguous run
        layer.length = context


def _fill_dynamic(cache: DynamicCache, context: int, batch: int, head_dim: int, num_kv_heads: int,
                  device: torch.device, dtype: torch.dtype) -> None:
    is_offloaded = bool(getattr(cache, "offloading", False)) and device.type == "cuda"
    for index, layer in enumerate(cache.layers):
        # After a forward, transformers' offloading cache holds layer 0 on the device (prefetched by the last
        # layer) and every other layer in host memory: reproduce that state.
        on_host = is_offloaded and index > 0
        shape = (batch, num_kv_heads, context, head_dim)
        keys, values = (torch.empty(shape, dtype=dtype, device="cpu" if on_host else device, pin_memory=on_host)
                        for _ in range(2))
        for tensor in (keys, values):
            for b in range(batch):
                for h in range(num_kv_heads):
                    _randomize(tensor[b, h], device)
        layer.dtype, layer.device = dtype, device
        layer.keys, layer.values = keys, values
        layer.is_initialized = True


def _randomize(target: torch.Tensor, device: torch.device) -> None:
    """Fills a [tokens, D] contiguous run with N(0, 1) values generated on ``device``, chunk by chunk."""
    for start in range(0, target.shape[0], _FILL_TOKENS):
        part = target[start : start + _FILL_TOKENS]
        if _same_device(part.device, device):
            part.normal_()
        else:
            part.copy_(torch.randn(part.shape, dtype=part.dtype, device=device))


def _write_random(home, context: int, device: torch.device, dtype: torch.dtype) -> None:
    """Through the home's own write: 8-bit homes store codes and scales of N(0, 1) values (``block`` would be a
    dequantized copy), and a disk home's checksum chain follows the rows written."""
    _, batch, _, group, head_dim = home.kv.shape  # [capacity, B, 2, g, D]
    for start in range(0, context, _FILL_TOKENS):
        num = min(_FILL_TOKENS, context - start)
        home.write(start, torch.randn(num, batch, 2, group, head_dim, dtype=dtype, device=device))


def _same_device(a: torch.device, b: torch.device) -> bool:
    # torch.device("cuda") != torch.device("cuda:0"), though both name the current GPU here
    return a.type == b.type and (a.type == "cpu" or (a.index or 0) == (b.index or 0))
