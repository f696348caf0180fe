"""4-bit fused MoE experts: transformers 5's 3-D ``gate_up_proj`` / ``down_proj`` parameters held as bitsandbytes nf4,
expanded only for the experts a token routes to.

Neither library quantizes these parameters for compute: transformers' bitsandbytes quantizer converts ``nn.Linear``
layers only; bitsandbytes' own ``replace_parameter_4bit`` stores a 3-D parameter in nf4 but expands the whole tensor
(every expert of the layer) at each access; torchao quantizes a 3-D parameter but its int8 tensor lacks the experts'
``bmm`` and its fp8 the index that picks an expert, and its int4 runs on CUDA only. So:

- ``Nf4ExpertsQuantizer``, transformers' bitsandbytes 4-bit quantizer registered under its own method name
  (``register_quantizer``), also quantizes each experts parameter as it loads, with bitsandbytes' kernel
  (``Params4bit``: one ``quantize_4bit`` of the 3-D tensor, blocks of 64): the dense experts never sit on the device;
- ``nf4_experts_forward``, registered in transformers' ``ExpertsInterface`` and set as the model's experts
  implementation, expands (``dequantize_4bit``) the routed experts' slices of those codes, a group at a time, and runs
  the same projections as transformers' eager loop.

A block of 64 never straddles two experts (an expert's weights are a multiple of 64), so an expert's expansion equals
its slice of the whole tensor's (tests/engine/test_quantized_experts.py). A lossy copy of the weights, as nf4 is.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

METHOD = "headinfer_nf4_experts"  # the quantizer's name in transformers' registries, and the experts implementation's
BLOCK = 64  # bitsandbytes' nf4 block: one fp32 absmax per 64 weights
#: the expansion scratch a group of experts may take (the compute dtype's copy of their up and down weights)
SCRATCH_BYTES = 256 * 2**20
_UP_NAMES = ("gate_up_proj", "up_proj")


def experts_weight_names(module: Any) -> tuple[str, ...]:
    """The 3-D weights of a transformers experts module (one decorated by ``use_experts_implementation``:
    ``has_gate`` set), or () for any other module."""
    if not hasattr(module, "has_gate") or not hasattr(module, "num_experts"):
        return ()
    names = tuple(name for name in (*_UP_NAMES, "down_proj")
                  if isinstance(getattr(module, name, None), torch.Tensor) and len(_shape(getattr(module, name))) == 3)
    return names if "down_proj" in names and len(names) == 2 else ()


def has_fused_experts(model: Any) -> bool:
    """Whether ``model`` (a skeleton on the meta device is enough) has experts modules whose weights are 3-D."""
    return any(experts_weight_names(module) for module in model.modules())


def expert_bytes(module: Any, dtype_bytes: int) -> int:
    """One expert's up and down weights in the compute dtype: what a routed expert expands into."""
    return sum(_shape(getattr(module, name))[1:].numel() for name in experts_weight_names(module)) * dtype_bytes


def expand(weight: Any, experts: torch.Tensor) -> torch.Tensor:
    """The rows ``experts`` (expert ids, ascending or not) of an nf4 3-D weight, in its compute dtype:
    ``[len(experts), out, in]``, each expert's blocks expanded by bitsandbytes' ``dequantize_4bit``."""
    import bitsandbytes.functional as F

    state = getattr(weight, "quant_state", None)
    if state is None:  # left dense (``quantizable``)
        return weight.index_select(0, experts)
    num, *rows = state.shape
    per_expert = rows[0] * rows[1]
    # Two 4-bit codes a byte, gathered as int32 words (an expert's bytes are a multiple of 32; torch's CPU uint8
    # gather is hundreds of times slower than int32's).
    words = weight.data.reshape(-1).view(torch.int32).view(num, -1)
    codes = words.index_select(0, experts).view(torch.uint8).reshape(-1, 1)
    absmax = state.absmax.view(num, per_expert // state.blocksize).index_select(0, experts).reshape(-1)
    part = F.QuantState(absmax=absmax, shape=torch.Size((len(experts), *rows)), code=state.code,
                        blocksize=state.blocksize, quant_type=state.quant_type, dtype=state.dtype)
    return F.dequantize_4bit(codes, part)


def _shape(weight: Any) -> torch.Size:
    state = getattr(weight, "quant_state", None)
    return state.shape if state is not None else weight.shape


def _project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, transposed: bool) -> torch.Tensor:
    # x: [tokens, in]; weight: [out, in] ([in, out] where the model stores them transposed) -> [tokens, out]
    out = x @ weight if transposed else torch.nn.functional.linear(x, weight)
    return out + bias if bias is not None else out


def nf4_experts_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                        top_k_weights: torch.Tensor) -> torch.Tensor:
    """An experts module's forward over its nf4 weights, as transformers' eager experts loop computes it.

    hidden_states: [tokens, hidden]; top_k_index, top_k_weights: [tokens, top_k] -> [tokens, hidden]."""
    up_name = "gate_up_proj" if self.has_gate else "up_proj"
    up, down = getattr(self, up_name), self.down_proj
    up_bias = getattr(self, f"{up_name}_bias", None) if self.has_bias else None
    down_bias = getattr(self, "down_proj_bias", None) if self.has_bias else None
    tokens, top_k = top_k_index.shape
    routes = top_k_index.reshape(-1)  # [tokens * top_k]: one (token, choice) pair a row
    # Each pair's output written once, then summed over the choices (torch's CPU index_add_ costs ms a call).
    out = hidden_states.new_zeros(tokens * top_k, hidden_states.shape[-1])
    hit = torch.unique(routes)
    hit = hit[hit < self.num_experts]  # (expert parallelism's sentinel ids run nowhere)
    group = max(1, SCRATCH_BYTES // max(1, expert_bytes(self, hidden_states.element_size())))
    for experts in hit.split(group):
        up_w, down_w = expand(up, experts), expand(down, experts)  # [group, out, in] each
        for pick, expert in enumerate(experts.tolist()):
            pairs = (routes == expert).nonzero().squeeze(-1)
            h = _project(hidden_states[pairs // top_k], up_w[pick], None if up_bias is None else up_bias[expert],
                         self.is_transposed)
            h = self._apply_gate(h) if self.has_gate else self.act_fn(h)
            h = _project(h, down_w[pick], None if down_bias is None else down_bias[expert], self.is_transposed)
            if self.has_post_expert_norm:
                h = self.post_expert_norm(h)
            out[pairs] = h * top_k_weights.reshape(-1)[pairs, None]
    return out.view(tokens, top_k, -1).sum(dim=1).to(hidden_states.dtype)


def quantizable(weight: Any) -> bool:
    """Whether a 3-D experts weight's rows fill whole nf4 blocks, so that no block straddles two experts and
    bitsandbytes' CPU kernels round-trip it (they misread rows of a partial block); else it stays dense (``expand``
    indexes it). Real models' widths are multiples of 64."""
    return _shape(weight)[-1] % BLOCK == 0


def quantize_weight(value: torch.Tensor) -> Any:
    """A 3-D experts weight as bitsandbytes nf4 on its device (one ``quantize_4bit`` call: blocks of 64)."""
    import bitsandbytes as bnb

    return bnb.nn.Params4bit(value, requires_grad=False, blocksize=BLOCK, compress_statistics=False, quant_type="nf4",
                             quant_storage=torch.uint8).to(value.device)


def experts_config(**bnb_kwargs: Any) -> Any:
    """A ``BitsAndBytesConfig`` (nf4, ``bnb_kwargs``) that ``from_pretrained`` loads through ``Nf4ExpertsQuantizer``:
    the linear layers as transformers' bitsandbytes quantizer does, the fused experts too."""
    _register()
    return _classes()[0](**bnb_kwargs)


_REGISTERED: list[tuple[type, type]] = []


def _classes() -> tuple[type, type]:
    if not _REGISTERED:
        _REGISTERED.append(_build_classes())
    return _REGISTERED[0]


def _register() -> None:
    from transformers.integrations.moe import ExpertsInterface
    from transformers.quantizers.auto import (
        AUTO_QUANTIZATION_CONFIG_MAPPING,
        AUTO_QUANTIZER_MAPPING,
        register_quantization_config,
        register_quantizer,
    )

    config_class, quantizer_class = _classes()
    if METHOD not in AUTO_QUANTIZER_MAPPING:
        register_quantizer(METHOD)(quantizer_class)
    if METHOD not in AUTO_QUANTIZATION_CONFIG_MAPPING:
        register_quantization_config(METHOD)(config_class)
    ExpertsInterface.register(METHOD, nf4_experts_forward)


def _build_classes() -> tuple[type, type]:
    """The config and quantizer classes, built on first use (transformers' quantizer modules import bitsandbytes
    lazily; the planner imports this module without them)."""
    from transformers import BitsAndBytesConfig
    from transformers.integrations.bitsandbytes import Bnb4bitQuantize
    from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer
    from transformers.quantizers.quantizers_utils import get_module_from_name

    class Nf4ExpertsConfig(BitsAndBytesConfig):
        """bitsandbytes nf4, fused experts included: its own method name picks ``Nf4ExpertsQuantizer``."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("quant_method", None)
            super().__init__(*args, **kwargs)
            self.quant_method = METHOD

    class Nf4ExpertsQuantize(Bnb4bitQuantize):
        """Quantizes a loaded tensor: an experts weight here, a linear layer's weight as transformers does."""

        def convert(self, input_dict: dict, full_layer_name: str | None = None, model: Any = None,
                    **kwargs: Any) -> dict:
            (param_name, value), = input_dict.items()
            module, name = get_module_from_name(model, param_name)
            if name not in experts_weight_names(module):
                return super().convert(input_dict, full_layer_name=full_layer_name, model=model, **kwargs)
            module._is_hf_initialized = True
            return {param_name: quantize_weight(value[0] if isinstance(value, list) else value)}

    class Nf4ExpertsQuantizer(Bnb4BitHfQuantizer):
        """transformers' bitsandbytes nf4 quantizer that also quantizes fused experts' 3-D weights at load, and sets
        the model's experts implementation to ``nf4_experts_forward``."""

        def param_needs_quantization(self, model: Any, param_name: str, **kwargs: Any) -> bool:
            module, name = get_module_from_name(model, param_name)
            if name in experts_weight_names(module):
                return quantizable(getattr(module, name))
            return super().param_needs_quantization(model, param_name, **kwargs)

        def get_quantize_ops(self) -> Any:
            return Nf4ExpertsQuantize(self)

        def _process_model_after_weight_loading(self, model: Any, **kwargs: Any) -> Any:
            model = super()._process_model_after_weight_loading(model, **kwargs)
            model.set_experts_implementation(METHOD)
            return model

        def is_serializable(self, *args: Any, **kwargs: Any) -> bool:
            return False  # (a published checkpoint of these experts would need a loader of its own)

    return Nf4ExpertsConfig, Nf4ExpertsQuantizer
