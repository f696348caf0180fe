"""Pure arithmetic of the hardware floors and the ratios every figure is reported with (docs/benchmarks/method.md).

- prefill floor = linear FLOPs / matmul rate + causal attention FLOPs / attention-kernel rate
- decode floor  = KV bytes that cross the link per step / measured host-to-device bandwidth

Rates are measured once per run (``benchmarks.harness.ceilings``) and stored as a ``ceilings`` record.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.planning.shape import ModelShape


@dataclass(frozen=True)
class Rates:
    """Measured ceilings: GB/s are decimal (1e9 bytes/s), TFLOP/s are 1e12 FLOP/s."""

    h2d_gbps: float | None = None
    d2h_gbps: float | None = None
    matmul_tflops: float | None = None
    attention_tflops: float | None = None

    @classmethod
    def from_metrics(cls, metrics: dict) -> Rates:
        """From a ``ceilings`` record's metrics; the attention rate is the best group size measured."""
        attention = [v for k, v in metrics.items() if k.startswith("attention_tflops") and v]
        return cls(metrics.get("h2d_gbps"), metrics.get("d2h_gbps"), metrics.get("matmul_tflops"),
                   max(attention) if attention else None)


def linear_params(shape: ModelShape, tied_embeddings: bool = False) -> int:
    """Parameters of the matmuls every token goes through (no embedding lookup, no lm_head:
    prefill keeps the logits of the last token only)."""
    embeddings = shape.vocab_size * shape.hidden_size * (1 if tied_embeddings else 2)
    return shape.num_params - embeddings


def prefill_flops(shape: ModelShape, tokens: int, tied_embeddings: bool = False) -> tuple[float, float]:
    """(linear FLOPs, causal attention FLOPs) of a prefill of ``tokens`` tokens.

    Linear: 2 x params per token. Attention: 4 x (heads x head_dim) x S^2/2 per layer (QK^T and PV over
    the causal half); e.g. Llama-3-8B at 1M tokens: 1.5e16 + 2.8e17 FLOPs.
    """
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    linear = 2.0 * linear_params(shape, tied_embeddings) * tokens
    attention = 4.0 * shape.num_heads * shape.head_dim * tokens * tokens / 2 * shape.num_layers
    return linear, attention


def prefill_floor_s(shape: ModelShape, tokens: int, rates: Rates, tied_embeddings: bool = False) -> float | None:
    """Seconds a prefill needs at the measured matmul and attention rates; None without both rates."""
    if not rates.matmul_tflops or not rates.attention_tflops:
        return None
    linear, attention = prefill_flops(shape, tokens, tied_embeddings)
    return linear / (rates.matmul_tflops * 1e12) + attention / (rates.attention_tflops * 1e12)


def offloaded_kv_bytes(shape: ModelShape, context: int, offloaded_heads: int, batch: int = 1) -> int:
    """K+V bytes of ``offloaded_heads`` (layer, KV head) pairs holding ``context`` tokens."""
    return offloaded_heads * context * shape.head_dim * 2 * shape.dtype_bytes * batch


def decode_floor_s(offloaded_bytes: int, rates: Rates) -> float | None:
    """Seconds per decode step to move the offloaded KV over the link; None without a rate or bytes."""
    if not rates.h2d_gbps or not offloaded_bytes:
        return None
    return offloaded_bytes / (rates.h2d_gbps * 1e9)


def ratio(value: float | None, reference: float | None) -> float | None:
    """value / reference, or None when either is missing or the reference is zero."""
    if value is None or not reference:
        return None
    return value / reference


def attention_flops(q_len: int, k_len: int, num_q_heads: int, head_dim: int, batch: int = 1) -> float:
    """FLOPs of bottom-right causal attention of ``q_len`` queries against ``k_len`` keys (k_len >= q_len)."""
    pairs = q_len * (k_len - q_len) + q_len * (q_len + 1) / 2
    return 4.0 * batch * num_q_heads * head_dim * pairs
