"""A GGUF file's blocks on the GPU at the file's size: each linear layer holds its tensor's raw blocks (uint8 on the
device) and expands them with torch ops, a slice of rows at a time, only while its matmul runs.

Why: transformers' GGUF loader dequantizes every tensor on CUDA (a 27B Q4_K_M's file grows about threefold: the
notes of docs/benchmarks/gguf-first-load.md).
Here the blocks stay as stored (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K: ``gguf_blocks.BLOCK_TYPES``), so
the weights held are the file's tensor bytes plus the small dense tensors (norms, in the compute dtype); the
scratch a forward adds is one slice of one layer's dense weight (``SLICE_BYTES``), freed before the next layer.

Exactness: the expansion is gguf-py's ``dequantize`` step for step in fp32 (the same products and sums, rounded one
by one: eager torch contracts nothing into an FMA), then one rounding to the compute dtype: bit for bit the weights
a dense load of the same file holds in that dtype (tests/engine/test_gguf_device.py). No hand-written kernel: on
PyPI nothing maintained dequantizes GGUF blocks on a torch device (gguf-py is numpy; llama.cpp's CUDA kernels are
not a torch op), and this runs wherever torch does, the CPU included, which is how it is tested.

How a model gets here: ``load_model(gguf, device="cuda", weights="gguf")`` (or ``"auto"`` where the dense weights
do not fit the GPU: ``loader.auto_weights``) loads the CPU model of the file's blocks
first (``gguf_blocks``: taken straight from the file once, ``gguf_direct``, and kept in the weights cache, mapped,
never a dense model in memory) and ``place`` moves it: each ``BlockLinear`` becomes an ``ExpandingLinear`` over the
same blocks, an embedding of blocks an ``ExpandingEmbedding`` (looked-up rows expanded), everything else is cast to
the compute dtype as a stock load in it would be. On the CPU the C kernels stay the path; ``HEADINFER_GGUF_TORCH=1``
puts this one there instead (the fallback's test, and the benchmark's).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..cpu.gguf_blocks import BLOCK_TYPES, BlockEmbedding, BlockLinear, TableEmbedding, by_row_slices

logger = logging.getLogger(__name__)

#: The most bytes of fp32 one expansion builds at a time (its compute-dtype copy and a few byte-wide temporaries
#: come on top: ``SCRATCH_PER_WEIGHT``): a 248K-row lm_head would otherwise expand to 5 GB for one call.
SLICE_BYTES = 256 << 20
#: Bytes of scratch per weight while a slice expands: the fp32 product (4), the weight in the compute dtype (up to 4),
#: and the byte-wide code temporaries (about 3). ``gguf_device_bytes`` plans with it.
SCRATCH_PER_WEIGHT = 11
FORCE_ENV = "HEADINFER_GGUF_TORCH"  # "1": the CPU also expands with torch (the fallback's test, the benchmark)


def torch_expansion_forced() -> bool:
    """True when ``HEADINFER_GGUF_TORCH=1`` asks the CPU to expand blocks with torch instead of the C kernels."""
    return os.environ.get(FORCE_ENV, "") == "1"


def _halves(raw: torch.Tensor, at: int) -> torch.Tensor:
    """raw: [n, bytes] uint8 -> [n, 1] fp32, the little-endian fp16 at byte ``at`` of each block, exactly."""
    return raw[:, at : at + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, groups: int, width: int) -> torch.Tensor:
    """qs: [n, groups * width] uint8 -> [n, groups * 2 * width]: each group's low nibbles, then its high ones
    (gguf-py's ``>> [0, 4]`` over a [n, groups, 1, width] view), written in place (no concatenation pass)."""
    qs = qs.reshape(qs.shape[0], groups, width)
    out = qs.new_empty(qs.shape[0], groups, 2, width)
    torch.bitwise_and(qs, 0x0F, out=out[:, :, 0])
    torch.bitwise_right_shift(qs, 4, out=out[:, :, 1])
    return out.reshape(qs.shape[0], -1)


def _bits(qh: torch.Tensor, shifts: int, mask: int) -> torch.Tensor:
    """qh: [n, groups, width] uint8 -> [n, groups * shifts * width]: bits ``(qh >> s) & mask`` for s over
    ``range(0, 8, 8 // shifts)``, shifts outer (gguf-py's layout of high bits)."""
    out = qh.new_empty(qh.shape[0], qh.shape[1], shifts, qh.shape[2])
    for i in range(shifts):
        torch.bitwise_and(qh >> (i * 8 // shifts), mask, out=out[:, :, i])
    return out.reshape(qh.shape[0], -1)


def _with_high_bits(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """``low | (high << 4)``, in place in ``low``."""
    return low.bitwise_or_(high.bitwise_left_shift_(4))


def _signed(codes: torch.Tensor, offset: int) -> torch.Tensor:
    """uint8 codes -> int8 ``codes - offset`` (exact: every code is below 64)."""
    return codes.view(torch.int8).sub_(offset)


# Each expansion computes gguf-py's fp32 products and sums, with the codes widened inside the multiply (type
# promotion: fp32 x uint8 computes in fp32) and the last op writing the compute dtype (``out=``: computed in fp32,
# rounded once on the write), so no pass writes an fp32 copy of the codes or of the finished weight.
def _q4_0(raw: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return torch.mul(_halves(raw, 0), _signed(_nibbles(raw[:, 2:], 1, 16), 8), out=out)


def _q4_1(raw: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return torch.add(_halves(raw, 0) * _nibbles(raw[:, 4:], 1, 16), _halves(raw, 2), out=out)


def _q5(raw: torch.Tensor, at: int) -> torch.Tensor:
    """[n, 32] uint8 codes of Q5_0 / Q5_1, whose 4 high-bit bytes sit at ``at``: bit i of the little-endian u32."""
    high = _bits(raw[:, at : at + 4].reshape(-1, 4, 1), 8, 1)  # [n, 4 bytes x 8 bits] = bit order 0..31
    return _with_high_bits(_nibbles(raw[:, at + 4 :], 1, 16), high)


def _q5_0(raw: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return torch.mul(_halves(raw, 0), _signed(_q5(raw, 2), 16), out=out)


def _q5_1(raw: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return torch.add(_halves(raw, 0) * _q5(raw, 4), _halves(raw, 2), out=out)


def _q8_0(raw: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return torch.mul(raw[:, 2:].view(torch.int8), _halves(raw, 0), out=out)


def _k_scales(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K: the 8 sub-block scales and mins of bytes 4..16, [n, 8, 1] fp32 each times d and dmin."""
    scales = raw[:, 4:16].reshape(-1, 3, 4)
    d, m, m_d = scales[:, 0], scales[:, 1], scales[:, 2]
    sc = torch.cat((d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)), dim=-1).float()
    mins = torch.cat((m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)), dim=-1).float()
    return (_halves(raw, 0) * sc).unsqueeze(-1), (_halves(raw, 2) * mins).unsqueeze(-1)


def _q4_k(raw: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    scale, low = _k_scales(raw)
    q = _nibbles(raw[:, 16:], 4, 32).reshape(-1, 8, 32)
    return torch.sub(scale * q, low, out=out.view(-1, 8, 32))


def _q5_k(raw: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    scale, low = _k_scales(raw)
    high = _bits(raw[:, 16:48].reshape(-1, 1, 32), 8, 1)  # [n, 8 x 32]: bit j of every byte is sub-block j
    q = _with_high_bits(_nibbles(raw[:, 48:], 4, 32), high).reshape(-1, 8, 32)
    return torch.sub(scale * q, low, out=out.view(-1, 8, 32))


def _q6_k(raw: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    high = _bits(raw[:, 128:192].reshape(-1, 2, 32), 4, 0x03)  # [n, 2 halves x 4 shifts x 32]
    q = _signed(_with_high_bits(_nibbles(raw[:, :128], 2, 64), high), 32).reshape(-1, 16, 16)
    scale = (_halves(raw, 208) * raw[:, 192:208].view(torch.int8)).unsqueeze(-1)  # [n, 16, 1] fp32
    return torch.mul(scale, q, out=out.view(-1, 16, 16))


_EXPAND: dict[int, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    2: _q4_0, 3: _q4_1, 6: _q5_0, 7: _q5_1, 8: _q8_0, 12: _q4_k, 13: _q5_k, 14: _q6_k}
assert set(_EXPAND) == set(BLOCK_TYPES), "every block type gguf_blocks keeps has its expansion here"


def expand(raw: torch.Tensor, qtype: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """raw: [rows, in / block * bytes] uint8 (on any device) -> [rows, in] in ``dtype`` on the same device: gguf-py's
    ``dequantize`` computed in fp32 with torch, rounded once to ``dtype``."""
    _, size, nbytes = BLOCK_TYPES[qtype]
    rows = raw.shape[0]
    out = torch.empty(rows * (raw.shape[1] // nbytes), size, dtype=dtype, device=raw.device)  # [rows * blocks, size]
    _EXPAND[qtype](raw.reshape(-1, nbytes), out)
    return out.view(rows, -1)  # [rows, in]


def slice_rows(in_features: int) -> int:
    """Rows of an [out, in] weight expanded at a time (at most ``SLICE_BYTES`` of fp32)."""
    return max(1, SLICE_BYTES // (4 * in_features))


def expansion_scratch(in_features: int, out_features: int) -> int:
    """The peak bytes an [out, in] layer's expansion takes while its matmul runs: one slice of its rows."""
    return min(out_features, slice_rows(in_features)) * in_features * SCRATCH_PER_WEIGHT


class ExpandingLinear(nn.Module):
    """``y = x @ W.T + bias`` with W held as a GGUF tensor's blocks, ``blocks`` [out, in / block * bytes] uint8 on
    the compute device, expanded to x's dtype a slice of rows at a time while the matmul runs."""

    def __init__(self, blocks: torch.Tensor, qtype: int, in_features: int, bias: torch.Tensor | None) -> None:
        super().__init__()
        _, size, nbytes = BLOCK_TYPES[qtype]
        assert blocks.dtype == torch.uint8 and in_features % size == 0
        assert blocks.shape[1] == in_features // size * nbytes
        self.out_features, self.in_features, self.qtype = blocks.shape[0], in_features, qtype
        self.register_buffer("blocks", blocks)  # the name weights_mode and num_weights look for
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out] in x's dtype
        blocks, bias = self._buffers["blocks"], self._parameters.get("bias")

        def product(lo: int, hi: int) -> torch.Tensor:
            return F.linear(x, expand(blocks[lo:hi], self.qtype, x.dtype), None if bias is None else bias[lo:hi])

        return by_row_slices(x, self.out_features, slice_rows(self.in_features), product)

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight this layer multiplies by in ``dtype``, [out, in] (all of it at once: for tests and tools)."""
        return expand(self.blocks, self.qtype, dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"blocks={BLOCK_TYPES[self.qtype][0]}, bias={self.bias is not None}")


class ExpandingEmbedding(TableEmbedding):
    """An embedding whose table is an ``ExpandingLinear``'s blocks: only the looked-up rows are expanded, in the
    compute dtype ``dtype``. As ``BlockEmbedding``: a tied lm_head's table is held, not registered (its blocks are
    the lm_head's), an untied embedding registers its own as ``rows``; ``scale``: Gemma's ``embed_scale``."""

    def __init__(self, table: ExpandingLinear, padding_idx: int | None, dtype: torch.dtype, owns_table: bool,
                 scale: torch.Tensor | None = None) -> None:
        super().__init__()
        self.hold_table(table, owns_table, scale)
        self.padding_idx, self.dtype = padding_idx, dtype

    @property
    def weight(self) -> torch.Tensor:
        """The expanded table, for code that reads ``get_input_embeddings().weight`` (built on each access)."""
        return self.table.dequantized(self.dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # ids: [...] -> [..., hidden] in the compute dtype
        table = self.table
        rows = expand(table.blocks[ids.reshape(-1)], table.qtype, self.dtype).reshape(*ids.shape, table.in_features)
        return rows if self.scale is None else rows * self.scale.to(rows.dtype)


def place(model: nn.Module, device: str | torch.device, dtype: torch.dtype,
          like: nn.Module | None = None) -> nn.Module:
    """Moves a model of GGUF blocks (``gguf_blocks.install_gguf_blocks``'s, on the CPU) to ``device``, computing in
    ``dtype``: each ``BlockLinear`` becomes an ``ExpandingLinear`` and each ``BlockEmbedding`` an
    ``ExpandingEmbedding`` over the same blocks; other parameters are cast to ``dtype``, buffers keep theirs
    except where ``like`` (the same model built on the meta device in ``dtype``, as a stock load builds it) holds
    the buffer in another (Gemma's ``embed_scale`` in bf16, rotary frequencies in fp32). Returns ``model``."""
    swapped: dict[int, ExpandingLinear] = {}

    def expanding(layer: BlockLinear) -> ExpandingLinear:
        if id(layer) not in swapped:
            bias = None if layer.bias is None else layer.bias.detach().to(device, dtype)
            swapped[id(layer)] = ExpandingLinear(layer.blocks.to(device), layer.qtype, layer.in_features, bias)
        return swapped[id(layer)]

    for name, module in list(model.named_modules()):
        if isinstance(module, BlockEmbedding):
            owns = "rows" in module._modules
            scale = None if module.scale is None else module.scale.to(device)
            model.set_submodule(name, ExpandingEmbedding(expanding(module.table), module.padding_idx, dtype, owns,
                                                         scale))
        elif isinstance(module, BlockLinear):
            model.set_submodule(name, expanding(module))
    stock = {} if like is None else {name: buffer.dtype for name, buffer in like.named_buffers()}
    moved: dict[int, nn.Parameter] = {}  # by identity: a parameter tied under two names stays one
    with torch.no_grad():
        for module in model.modules():
            for key, parameter in module._parameters.items():
                if parameter is not None and id(parameter) not in moved:
                    kind = dtype if parameter.is_floating_point() else parameter.dtype
                    moved[id(parameter)] = nn.Parameter(parameter.to(device, kind), requires_grad=False)
                if parameter is not None:
                    module._parameters[key] = moved[id(parameter)]
        for name, buffer in list(model.named_buffers()):
            owner, _, key = name.rpartition(".")
            holder = model.get_submodule(owner)
            holder._buffers[key] = buffer.to(device, stock.get(name, buffer.dtype))
    logger.info("gguf weights on %s: %d layers keep the file's blocks (%.2f GB), expanded to %s as each matmul "
                "runs", device, len(swapped), sum(m.blocks.numel() for m in swapped.values()) / 1e9,
                str(dtype).removeprefix("torch."))
    return model


@dataclass(frozen=True)
class DeviceBytes:
    """What a GGUF file's model holds on a GPU served as ``weights="gguf"`` (``gguf_device_bytes``)."""

    held: int  # the weights' bytes on the device: the blocks as stored, every other tensor in the compute dtype
    scratch: int  # the peak of one layer's expansion (a slice of its rows: ``SLICE_BYTES``), freed layer by layer
    file_tensors: int  # the file's tensor bytes (without the alignment between them), for comparison
    quantization: str  # the block types held, most bytes first ("Q4_K+Q6_K"), or "dense"


def gguf_device_bytes(path: str | Path, dtype_bytes: int = 2) -> DeviceBytes:
    """From the header alone (no weight read): the bytes ``load_model(path, device="cuda", weights="gguf")``
    holds on the GPU, and its expansion scratch. The planner's number for a GGUF on a GPU (weights = ``held``,
    plus ``scratch`` among the working buffers); ``dtype_bytes``: 2 for bf16/fp16 compute, 4 for fp32.

    Counted as the load places them: a 2-D tensor of a kept block type keeps its bytes (the lm_head tied to
    the embedding shares its blocks, as the file does); anything else (norms, biases, a type the expansion does
    not read such as Q3_K or IQ4_XS) becomes dense in the compute dtype. The embedding and lm_head are counted
    as the file holds them: its blocks where kept, else dense; the small buffers the model builds itself (rotary
    frequencies) are left out. Raises ``GGUFHeaderError`` for a file that is not a GGUF."""
    from .gguf_header import read_header

    header = read_header(path)
    held, stored, scratch, kinds = 0, 0, 0, {}
    for tensor in header.tensors:
        elements = rows = 1
        for dim in tensor.shape:
            elements *= dim
        for dim in tensor.shape[1:]:
            rows *= dim
        stored += tensor.row_bytes * rows
        if tensor.qtype in BLOCK_TYPES and len(tensor.shape) == 2:
            size = tensor.row_bytes * tensor.shape[1]
            held += size
            kinds[BLOCK_TYPES[tensor.qtype][0]] = kinds.get(BLOCK_TYPES[tensor.qtype][0], 0) + size
            scratch = max(scratch, expansion_scratch(tensor.shape[0], tensor.shape[1]))  # GGUF dims: [in, out]
        else:
            held += elements * dtype_bytes
    quantization = "+".join(sorted(kinds, key=kinds.get, reverse=True)) or "dense"
    return DeviceBytes(held, scratch, stored, quantization)
