"""Weight-only int8 for the CPU: a loaded model's ``nn.Linear`` layers (and a tied plain embedding) hold int8 codes
with one power-of-two scale per output channel.

Decode at short context reads every weight once per token, so int8 weights read a quarter of fp32's bytes. The model
computes in one of two dtypes:

- fp32 (the default where a C compiler is found): ``int8_matmul`` widens the codes to fp32 in a C GEMV for decode
  rows (dequantize-and-matmul for prefill chunks); the rest of the model, the KV cache and attention stay fp32, so
  CPU decode attention takes the C tile (``engine.kv.kernels``, route ``cpu-native``);
- bf16: torch's CPU kernel ``aten._weight_int8pack_mm`` (bf16 activations only: its fp32 path is a scalar loop)
  where it passed its probe on this CPU, else the C GEMV on the fp32 widening (``int8_matmul.int8_linear_bf16``).

The scales are powers of two so that every code times its scale is exactly a bf16 (and fp32) number: the int8 model
runs the very weights that ``dequantized_state_dict`` gives a stock model of its dtype, and the parity tests compare
the two. Only the model instance is changed: its submodules are replaced, no class is patched.
"""

from __future__ import annotations

from collections.abc import Callable

import logging

import torch
from torch import nn

from ..errors import InputError
from ..planning.budgets import num_weights  # noqa: F401 (the loader's and tests' name for it)
from .int8_matmul import int8_linear, int8_linear_bf16

logger = logging.getLogger(__name__)

WEIGHT_MODES = ("dense", "int8", "gguf")  # gguf: engine.cpu.gguf_blocks
COMPUTE_DTYPES = (torch.float32, torch.bfloat16)  # what an int8 model computes in (see the module docstring)
_K_MULTIPLE = 8  # the kernel reads the input dimension in blocks of 8 (other widths give wrong results)
_ROWS_PER_PASS = 4096  # rows quantized at a time: the fp32 copy of a 49K-row lm_head would be 113 MB at once


class Int8Linear(nn.Module):
    """``y = x @ (codes * scales[:, None]).T + bias`` with int8 ``codes`` [out, in] and ``scales`` [out] (bf16)."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        assert codes.dtype == torch.int8 and codes.dim() == 2 and scales.shape == codes.shape[:1]
        self.out_features, self.in_features = codes.shape
        self.register_buffer("codes", codes)  # the name engine.models.weights_mode.weights_mode looks for
        self.register_buffer("scales", scales)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]. A decode step calls this ~200 times: the buffers are read from their dicts
        # (nn.Module's attribute lookup for them costs more than the small layers' GEMV) and no no-op cast runs.
        buffers = self._buffers
        scales = buffers["scales"]
        if scales.dtype == torch.float32:
            out = int8_linear(x if x.dtype == torch.float32 else x.float(), buffers["codes"], scales,
                              self._parameters.get("bias"))
            return out if x.dtype == torch.float32 else out.to(x.dtype)
        out = int8_linear_bf16(x.to(scales.dtype), buffers["codes"], scales, self._parameters.get("bias"))
        return out.to(x.dtype)

    def dequantized(self) -> torch.Tensor:
        """The weight this layer multiplies by, [out, in] in the scales' dtype (exact: the scales are powers of 2)."""
        return self.codes.to(self.scales.dtype) * self.scales[:, None]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Int8Embedding(nn.Module):
    """A plain embedding whose rows are an ``Int8Linear``'s (a tied lm_head): ``row(i) = codes[i] * scales[i]``."""

    def __init__(self, table: Int8Linear, padding_idx: int | None) -> None:
        super().__init__()
        # Held, not registered: the codes belong to the lm_head, and a second registration would list them twice
        # (state dicts, named_modules) under another name.
        self._table = (table,)
        self.padding_idx = padding_idx

    @property
    def table(self) -> Int8Linear:
        return self._table[0]

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized table, for code that reads ``get_input_embeddings().weight`` (built on each access)."""
        return self.table.dequantized()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # ids: [...] -> [..., hidden]
        return self.table.codes[ids].to(self.table.scales.dtype) * self.table.scales[ids].unsqueeze(-1)


def quantize_rows(weight: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes int8 [out, in], scales [out])``: per row the smallest power of two s with |w| <= 127 s, codes
    round(w / s). A row of zeros gets scale 1."""
    codes = torch.empty(weight.shape, dtype=torch.int8)
    scales = torch.empty(weight.shape[0], dtype=dtype)
    for start in range(0, weight.shape[0], _ROWS_PER_PASS):
        rows = weight[start : start + _ROWS_PER_PASS].float()
        peak = rows.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny)
        scale = torch.exp2(torch.ceil(torch.log2(peak / 127)))
        scale = torch.where(rows.abs().amax(dim=1) > 0, scale, torch.ones_like(scale))
        codes[start : start + rows.shape[0]] = torch.round(rows / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        scales[start : start + rows.shape[0]] = scale.to(dtype)
    return codes, scales


def quantize_int8(model: nn.Module, dtype: torch.dtype = torch.bfloat16) -> int:
    """Replaces ``model``'s ``nn.Linear`` layers on the CPU by ``Int8Linear`` (and a plain embedding tied to the
    lm_head by an ``Int8Embedding`` over the same codes); the rest of the model is cast to ``dtype``.

    A layer whose input width is not a multiple of 8 stays dense, and so does an lm_head tied to an embedding that
    is not a plain ``nn.Embedding`` (Gemma scales its embedding: quantizing one side would untie the two).
    Returns the number of layers replaced.
    """
    if dtype not in COMPUTE_DTYPES:
        raise InputError(f"int8 weights compute in float32 or bfloat16, not {dtype}")
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise InputError("int8 weights are for the CPU; load the model with device='cpu'")
    targets = int8_targets(model)
    for name, module, ties_embedding in targets:
        codes, scales = quantize_rows(module.weight.detach(), dtype)
        bias = None if module.bias is None else module.bias.detach().to(dtype)
        install(model, name, Int8Linear(codes, scales, bias), ties_embedding, Int8Embedding)
    # Parameters only, as loading in ``dtype`` does: stock keeps computed buffers (rotary ``inv_freq``) in fp32,
    # and a bf16 ``inv_freq`` moves every rotary angle (logits a few bf16 steps from stock's).
    for parameter in model.parameters():
        if parameter.is_floating_point():
            parameter.data = parameter.data.to(dtype)
    logger.info("int8 weights: %d linear layers quantized (per-channel power-of-two scales)", len(targets))
    return len(targets)


def int8_skeleton(model: nn.Module, dtype: torch.dtype = torch.bfloat16) -> int:
    """Swaps in, where ``quantize_int8`` would quantize, ``Int8Linear`` layers of the right shapes holding meta
    tensors: the frame for a model built on the meta device whose saved int8 tensors are assigned afterwards
    (``engine.models.weights_cache``), so no dense weight is ever allocated. Returns the number of layers swapped."""
    targets = int8_targets(model)
    for name, module, ties_embedding in targets:
        codes = torch.empty(module.weight.shape, dtype=torch.int8, device="meta")
        scales = torch.empty(module.out_features, dtype=dtype, device="meta")
        bias = None if module.bias is None else torch.empty(module.out_features, dtype=dtype, device="meta")
        install(model, name, Int8Linear(codes, scales, bias), ties_embedding, Int8Embedding)
    return len(targets)


def int8_targets(model: nn.Module) -> list[tuple[str, nn.Linear, bool]]:
    """``(name, layer, ties the embedding)`` of each linear layer int8 replaces; one list for quantizing and for
    building the empty frame, so a cached int8 model has exactly the layers a freshly quantized one has."""
    return linear_targets(model, _K_MULTIPLE)


def linear_targets(model: nn.Module, multiple: int,
                   can_tie: Callable[[nn.Module], bool] | None = None) -> list[tuple[str, nn.Linear, bool]]:
    """``(name, layer, ties the embedding)`` of each ``nn.Linear`` whose input width is a multiple of ``multiple``;
    a tied lm_head only when its embedding is a plain ``nn.Embedding``, or one ``can_tie`` accepts (Gemma scales its
    embedding: replacing one side by a layer that cannot scale would untie the two)."""
    embeddings = model.get_input_embeddings()
    output = model.get_output_embeddings()
    tied = output is not None and output.weight is embeddings.weight
    keeps_tie = type(embeddings) is nn.Embedding or (can_tie is not None and can_tie(embeddings))
    targets = []
    for name, module in model.named_modules():
        if type(module) is not nn.Linear or module.in_features % multiple:
            continue
        if module is output and tied and not keeps_tie:
            continue
        targets.append((name, module, module is output and tied))
    return targets


def install(model: nn.Module, name: str, layer: nn.Module, ties_embedding: bool,
            embedding: type[nn.Module]) -> None:
    """Puts ``layer`` at ``name``; a tied lm_head's embedding becomes ``embedding(layer, padding_idx)`` over the
    same stored weights."""
    padding_idx = model.get_input_embeddings().padding_idx if ties_embedding else None
    model.set_submodule(name, layer)
    if ties_embedding:
        model.set_input_embeddings(embedding(layer, padding_idx))


def dequantized_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The dense weights an int8 model runs, keyed as in the stock model: load them into a stock bf16 model of the
    same config to run exactly these weights (the parity tests' reference)."""
    state = {}
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(module, Int8Linear):
            state[f"{prefix}weight"] = module.dequantized()
            if module.bias is not None:
                state[f"{prefix}bias"] = module.bias.detach()
        elif isinstance(module, Int8Embedding):
            state[f"{prefix}weight"] = module.weight
    return state
