"""A CPU decode step of a Llama-family model on GGUF blocks, in two C calls per layer around the cache's attention.

Why: a decode step on the CPU streams every weight block (docs/benchmarks/llamacpp-1.5b.md) through every cache
level, so the ~15 small torch ops of a layer (norms, RoPE, SiLU·mul, residual adds) and transformers' per-layer
Python run with the dispatcher's state evicted: measured at 2K tokens on two cores, they took a fifth of the step.
Here a layer is ``gguf_decode_attention_in`` (norm, q/k/v projections as one split row range, RoPE), the cache's
own ``update`` and ``attend`` (the same head-wise schedule, host attention, probes and 8-bit or disk homes as any
forward; where the layer keeps one plain fp32 home in RAM, the C call writes k and v into the home's row itself and
the layer's ``attend_decoded`` runs the same C attention without staging or the schedule), then
``gguf_decode_mlp`` (o projection and residual, norm, SiLU-gated MLP, residual): see ``gguf_decode.h``.

Only a one-token step on the CPU takes this path, and only for models whose layers are exactly the Llama form
(``FusedDecode.for_model`` checks every module; anything else keeps the model's own forward). The logits equal the
model's forward within fp32 rounding (the parity tests compare both paths and stock transformers).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import ForwardInterrupted
from ..kv import route
from . import gguf_blocks
from .gguf_blocks import BlockLinear, Projection
from .int8_matmul import split_threads

logger = logging.getLogger(__name__)

#: model types whose decoder layer is RMSNorm, q/k/v/o attention with rotate-half RoPE (Qwen3: q and k heads
#: RMS-normed first), RMSNorm, SiLU-gated MLP
MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
_HEAD_NORMS = {"qwen3"}  # whose attention has q_norm and k_norm


def _window(model_type: str, attention: nn.Module) -> int | None:
    """The sliding window the model's attention passes to the attention function: Mistral reads its config, Qwen2
    and Qwen3 their module's per-layer attribute (None on full-attention layers), Llama none."""
    if model_type == "mistral":
        return getattr(attention.config, "sliding_window", None)
    if model_type in ("qwen2", "qwen3"):
        return attention.sliding_window
    return None


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's pointers and sizes, taken once (the tensors are the model's own and outlive the step)."""

    norm: int  # input_layernorm.weight [hidden] fp32
    norm_eps: float
    qkv: ctypes.Array  # 3 Projection: q, k, v
    qkv_rows: tuple[int, int, int]
    scaling: float  # the attention's softmax scale
    window: int | None  # the sliding window its attention passes on (None: full attention)
    q_norm: int  # Qwen3's per-head q/k norm weights [head_dim] fp32 (0: none)
    k_norm: int
    head_eps: float
    o: Projection
    o_inputs: int  # the o projection's input width (heads x head_dim)
    post_norm: int
    post_eps: float
    gate_up: ctypes.Array  # 2 Projection
    down: Projection
    attention_threads: int  # the pool's threads for the q/k/v rows and for the MLP's, by their weight bytes
    mlp_threads: int
    held: tuple  # every tensor a pointer above points into: alive while the step may call C with them


def _projection(module: BlockLinear) -> Projection:
    bias = module._parameters.get("bias")
    return Projection(module.blocks.data_ptr(), 0 if bias is None else bias.data_ptr(), module.out_features,
                      module.qtype)


def _norm_eps(norm: nn.Module) -> float | None:
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    weight = getattr(norm, "weight", None)
    if eps is None or not isinstance(weight, torch.Tensor) or weight.dtype != torch.float32 or not weight.is_contiguous():
        return None
    return float(eps)


def _why_not(model: nn.Module) -> str | None:
    """Why ``model`` cannot take the fused step (None: it can)."""
    config = model.config
    if config.model_type not in MODEL_TYPES:
        return f"model type {config.model_type}"
    if getattr(config, "hidden_act", None) != "silu":
        return f"activation {getattr(config, 'hidden_act', None)}"
    if getattr(config, "partial_rotary_factor", 1.0) not in (None, 1.0):
        return "partial rotary"
    if gguf_blocks.kernel() is None:
        return "no C kernel"
    decoder = model.model
    if not hasattr(decoder, "rotary_emb") or not hasattr(model, "lm_head"):
        return "no rotary embedding or lm_head"
    expected = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
    projections = {"q_proj", "k_proj", "v_proj", "o_proj"}
    head_norms = {"q_norm", "k_norm"} if config.model_type in _HEAD_NORMS else set()
    for layer in decoder.layers:
        if set(layer._modules) != expected:
            return f"layer modules {sorted(layer._modules)}"
        attention, mlp = layer.self_attn, layer.mlp
        if set(attention._modules) != projections | head_norms or \
                set(mlp._modules) - {"act_fn"} != {"gate_proj", "up_proj", "down_proj"}:
            return "attention or MLP modules"
        if not all(isinstance(m, BlockLinear) for m in (*(attention._modules[p] for p in projections),
                                                         mlp.gate_proj, mlp.up_proj, mlp.down_proj)):
            return "projections not all GGUF blocks"
        if any(_norm_eps(attention._modules[n]) is None or attention._modules[n].weight.numel() != attention.head_dim
               for n in head_norms):
            return "q/k norms"
        if _norm_eps(layer.input_layernorm) is None or _norm_eps(layer.post_attention_layernorm) is None:
            return "norms"
        if mlp.gate_proj.out_features != mlp.up_proj.out_features or \
                attention.q_proj.out_features % attention.head_dim or attention.k_proj.out_features % attention.head_dim:
            return "shapes"
    return None


class FusedDecode:
    """``step(token, cache, should_stop)``: one decode token through ``model`` and ``cache`` (a HeadInferCache), the
    next logits [vocab] fp32. Built by ``for_model``, which returns None for a model it cannot run exactly."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        decoder = model.model
        self.functions = gguf_blocks.kernel()
        self.hidden = model.config.hidden_size
        self.head_dim = decoder.layers[0].self_attn.head_dim
        self.layers = [self._layer(layer) for layer in decoder.layers]
        # C scratch reused every layer: the attention input's norm [hidden]; the MLP's [hidden + 2 * intermediate]
        self._normed = torch.empty(self.hidden)
        self._mlp_scratch = torch.empty(self.hidden + 2 * max(layer.gate_up[0].out for layer in self.layers))

    @classmethod
    def for_model(cls, model: nn.Module) -> "FusedDecode | None":
        try:
            why = _why_not(model)
        except AttributeError as error:  # a model of another shape than the checks expect
            why = str(error)
        if why is not None:
            logger.debug("fused decode step not used: %s", why)
            return None
        logger.info("decode steps run fused (two C calls a layer)")
        return cls(model)

    def _layer(self, layer: nn.Module) -> _Layer:
        attention, mlp = layer.self_attn, layer.mlp
        qkv_modules = (attention.q_proj, attention.k_proj, attention.v_proj)
        qkv = (Projection * 3)(*map(_projection, qkv_modules))
        gate_up = (Projection * 2)(_projection(mlp.gate_proj), _projection(mlp.up_proj))
        mlp_bytes = sum(m.blocks.numel() for m in (mlp.gate_proj, mlp.up_proj))
        q_norm, k_norm = (getattr(attention, name, None) for name in ("q_norm", "k_norm"))
        return _Layer(layer.input_layernorm.weight.data_ptr(), _norm_eps(layer.input_layernorm), qkv,
                      tuple(m.out_features for m in qkv_modules), attention.scaling,
                      _window(self.model.config.model_type, attention),
                      0 if q_norm is None else q_norm.weight.data_ptr(),
                      0 if k_norm is None else k_norm.weight.data_ptr(),
                      0.0 if q_norm is None else _norm_eps(q_norm), _projection(attention.o_proj),
                      attention.o_proj.in_features,
                      layer.post_attention_layernorm.weight.data_ptr(), _norm_eps(layer.post_attention_layernorm),
                      gate_up, _projection(mlp.down_proj),
                      split_threads(sum(m.blocks.numel() for m in qkv_modules), gguf_blocks._SPLIT_BYTES),
                      split_threads(mlp_bytes, gguf_blocks._SPLIT_BYTES),
                      tuple(t for m in (layer.input_layernorm, layer.post_attention_layernorm, q_norm, k_norm,
                                        *qkv_modules, attention.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
                            if m is not None for t in (*m._buffers.values(), *m._parameters.values())
                            if t is not None))

    def step(self, token: int, cache, should_stop: Callable[[], bool] | None = None) -> torch.Tensor:
        """Appends ``token`` to every layer of ``cache`` and returns the logits after it, [vocab] fp32. Raises
        ``ForwardInterrupted`` between layers once ``should_stop()``; the caller gives the layers that took the
        token back (as after a stopped forward)."""
        decoder, functions, head_dim = self.model.model, self.functions, self.head_dim
        position = cache.get_seq_length()
        ids = torch.tensor([[token]])  # [1, 1]
        h = decoder.embed_tokens(ids).contiguous()  # [1, 1, hidden] fp32, updated in place layer by layer
        cos, sin = decoder.rotary_emb(h, torch.tensor([[position]]))  # [1, 1, head_dim] each
        cos, sin = cos.float().contiguous(), sin.float().contiguous()
        normed, scratch = self._normed.data_ptr(), self._mlp_scratch.data_ptr()
        for index, layer in enumerate(self.layers):
            if should_stop is not None and should_stop():
                raise ForwardInterrupted(f"stopped before decoder layer {index}")
            q_rows, k_rows, v_rows = layer.qkv_rows
            qkv = torch.empty(q_rows + k_rows + v_rows)  # [q | k | v], fresh: the cache stages k and v
            layer_cache = cache.layers[index]
            row = layer_cache.decode_row()  # [B, 2, KVH, D] in the home, where the C call writes k and v too
            _check(functions.decode_attention_in(h.data_ptr(), layer.norm, layer.norm_eps, self.hidden, layer.qkv,
                                                 layer.q_norm, layer.k_norm, layer.head_eps, cos.data_ptr(),
                                                 sin.data_ptr(), head_dim, qkv.data_ptr(), normed,
                                                 layer.attention_threads, None if row is None else row.data_ptr()))
            query = qkv[:q_rows].view(1, q_rows // head_dim, 1, head_dim)  # [B, H, Q, D]
            if row is not None:
                attended = layer_cache.attend_decoded(query, scaling=layer.scaling, window=layer.window)
            else:
                key = qkv[q_rows : q_rows + k_rows].view(1, k_rows // head_dim, 1, head_dim)  # [B, KVH, Q, D]
                value = qkv[q_rows + k_rows :].view(1, v_rows // head_dim, 1, head_dim)
                key, value = layer_cache.update(key, value)
                owner = route.take(index, key)  # the layer that took them, as the attention function finds it
                attended = owner.attend(query, key, value, scaling=layer.scaling, window=layer.window,
                                        softcap=None)
                attended = attended.contiguous()  # [1, 1, H, D]
            _check(functions.decode_mlp(h.data_ptr(), attended.data_ptr(), layer.o_inputs, ctypes.byref(layer.o),
                                        layer.post_norm, layer.post_eps, layer.gate_up, ctypes.byref(layer.down),
                                        scratch, layer.mlp_threads))
        return self.model.lm_head(decoder.norm(h))[0, -1]  # [vocab]


def _check(status: int) -> None:
    if status == -2:
        raise MemoryError("fused decode: no memory for the activations' block sums")
    assert status == 0, "fused decode: a projection's block type or input width the kernel does not take"
