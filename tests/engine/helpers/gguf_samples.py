"""GGUF blocks for the tests, made the way a GGUF file holds them: gguf-py's own quantization of a weight, or
random bytes that are valid blocks of a type (finite fp16 factors)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.quants import quantize as gguf_quantize

from engine.cpu import gguf_blocks
from engine.cpu.gguf_blocks import BLOCK_TYPES

TYPES = {name: qtype for qtype, (name, _, _) in BLOCK_TYPES.items()}
SMALL = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]  # gguf-py quantizes these itself
# where each type keeps its fp16 factors (d; m or dmin): random bytes anywhere else are a valid block
HALVES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2),
          "Q6_K": (208,)}
needs_kernel = pytest.mark.skipif(gguf_blocks.kernel() is None, reason="no C compiler here")  # the C GEMV


def blocks_of(weight: np.ndarray, kind: str) -> torch.Tensor:
    """gguf-py's own quantization of ``weight`` [out, in]: the bytes a GGUF file holds."""
    return torch.from_numpy(gguf_quantize(weight.astype(np.float32), TYPES[kind]))


def random_blocks(out_features: int, in_features: int, kind: str, seed: int = 0) -> torch.Tensor:
    """Blocks of every bit pattern (scales, mins, high bits, nibbles) with finite fp16 factors: [out, bytes]."""
    _, size, nbytes = BLOCK_TYPES[TYPES[kind]]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (out_features, in_features // size, nbytes), dtype=np.uint8)
    for offset in HALVES[kind]:
        factors = (rng.standard_normal((out_features, in_features // size)) * 0.01).astype(np.float16)
        raw[..., offset : offset + 2] = factors.view(np.uint8).reshape(out_features, -1, 2)
    return torch.from_numpy(raw.reshape(out_features, -1))


def random_weight(out_features: int, in_features: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((out_features, in_features)).astype(np.float32) * 0.05
    weight[-1, :32] += 3.0  # a block with an offset (Q4_1's m far from 0)
    weight[0] = 0.0  # a row of zeros: d = 0
    return weight
