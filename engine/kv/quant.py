"""Optional 8-bit KV for host homes: one scale per (token, K or V, head), lossy and labelled so everywhere.

``int8`` stores round(x / s) with s = max|x| / 127 over the head's channels; ``fp8`` stores x / s as
float8_e4m3fn with s = max|x| / 448. Both halve host RAM and link bytes against bf16 (plus 4 bytes of scale
per head_dim channels). Quantization happens where a chunk is staged (the compute device), dequantization
where a fetch lands (into the ping-pong buffer), so attention itself always runs in the model's dtype.
"""

from __future__ import annotations

import torch

KV_DTYPES = {"int8": (torch.int8, 127.0), "fp8": (torch.float8_e4m3fn, 448.0)}
SCALE_DTYPE = torch.float32


def storage_dtype(kv_dtype: str) -> torch.dtype:
    return KV_DTYPES[kv_dtype][0]


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def bytes_per_element(kv_dtype: str | None, dtype_bytes: int, head_dim: int) -> float:
    """Host bytes per K or V element, scales included."""
    if kv_dtype is None:
        return float(dtype_bytes)
    return 1.0 + torch.empty((), dtype=SCALE_DTYPE).element_size() / head_dim


def quantize(values: torch.Tensor, kv_dtype: str, out: tuple[torch.Tensor, torch.Tensor] | None = None):
    """values: [..., D] -> (codes [..., D], scales [..., 1]); into ``out`` when given."""
    dtype, limit = KV_DTYPES[kv_dtype]
    amax = values.abs().amax(dim=-1, keepdim=True).to(SCALE_DTYPE)
    scales = torch.clamp(amax / limit, min=torch.finfo(SCALE_DTYPE).tiny)
    scaled = values.to(SCALE_DTYPE) / scales
    if dtype == torch.int8:
        scaled = scaled.round_().clamp_(-limit, limit)
    if out is None:
        return scaled.to(dtype), scales
    out[0].copy_(scaled)
    out[1].copy_(scales)
    return out


def dequantize(codes: torch.Tensor, scales: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """codes [..., D] and scales [..., 1] -> ``out`` (the model's dtype), in place: no temporary as large as the
    fetched range. Codes (int8, e4m3) are exact in bf16/fp16/fp32, and ``mul_`` computes each product in fp32
    (the promoted dtype) before rounding it into ``out``, so this equals ``(codes.float() * scales).to(dtype)``."""
    out.copy_(codes)
    return out.mul_(scales)
