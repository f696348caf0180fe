"""Quantized weights through maintained libraries (torchao, bitsandbytes), loaded by transformers' own quantizers
(``quantization_config=`` in ``from_pretrained``): no kernel of ours, no class patched.

The weights modes, as ``load_model(weights=...)`` and ``launch.py --weights`` take them:

- ``"8bit"`` / ``"4bit"``: the library is chosen for the device (``PREFERENCE``, then what is installed);
- a scheme by name (``SCHEMES``): ``torchao-int8``, ``torchao-int4``, ``torchao-fp8``, ``bnb-int8``, ``bnb-nf4``;
- a pre-quantized checkpoint (its ``config.json`` has a ``quantization_config``: compressed-tensors, AWQ/GPTQ,
  fp8...) loads as it is stored with ``auto`` or ``dense``; ``prequantized_method`` names its method.

Each scheme is a lossy copy of the bf16 (or fp32) weights; exactness is restated over the *same* quantized
weights: head-wise attention over the quantized model equals stock attention over that model (tests/engine/
test_quantized_parity.py). The libraries quantize ``nn.Linear`` layers: the embeddings and the lm_head stay in the
compute dtype (``kept_dense_params``). transformers 5's fused MoE experts (3-D ``gate_up_proj`` / ``down_proj``
parameters, not linear layers, ``fused_experts_params``) are quantized by ``bnb-nf4`` alone, through
``engine.models.quantized_experts`` (bitsandbytes' kernels, the routed experts expanded); the 8-bit schemes and
torchao's int4 leave them dense.

For the planner and the picker (config alone, nothing imported): ``bytes_per_weight(mode)`` is what a quantized
linear weight holds (its scales included), ``held_weight_bytes(mode, num_params, kept_dense)`` a model's total,
and ``auto_gpu_weights`` the ``auto`` rule on a GPU, the loader's and the picker's: bf16 where the weights fit
beside the working buffers, else 8-bit, else 4-bit. The libraries are imported only when a model is loaded in one of their modes: the app starts
without them, and a mode whose library is missing is refused naming the pip command.
"""

from __future__ import annotations

import importlib.util
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from . import quantized_experts
from ..errors import InputError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Quantization:
    """One quantization scheme of one library."""

    name: str  # the weights mode that names it, e.g. "torchao-int8"
    bits: int  # 8 or 4: what "8bit" / "4bit" resolve among
    library: str  # the import name, looked for before loading
    pip: str  # what to install when it is missing (the pin requirements.txt holds)
    devices: tuple[str, ...]  # torch device types the library computes it on
    bytes_per_weight: float  # a quantized linear weight's bytes, its scales included
    description: str  # for the header: what the weights are
    dtypes: tuple[str, ...] = ()  # the compute dtypes it runs in (empty: any)
    # Head-wise and stock logits over the same quantized weights agree within the compute dtype's tolerance, or
    # within this where the library's own matmul rounds its inputs (bitsandbytes' int8 rounds rows to fp16: an
    # fp32 rounding difference between the two attentions can move a row's code by one).
    parity_rtol: float | None = None
    experts: bool = False  # whether it quantizes fused MoE experts too (engine.models.quantized_experts)

    def label(self) -> str:
        """The header's words: which weights, and that they are a lossy copy of the model's own."""
        return f"{self.bits}-bit weights ({self.description}; a lossy copy of the bf16 weights)"


_TORCHAO = "torchao==0.18.0"
_BNB = "bitsandbytes==0.50.2"
_INT4_GROUP = 128  # torchao int4: one bf16 scale and zero point per 128 weights of a row
_NF4_BLOCK = 64  # bitsandbytes nf4: one fp32 absmax per 64 weights
_CPU_NF4_ROWS = 32  # bitsandbytes' CPU nf4 kernel packs output rows in blocks of 32

#: name -> scheme. Bytes per weight: the codes plus their scales (int8: one scale per output row, negligible).
SCHEMES: dict[str, Quantization] = {q.name: q for q in (
    Quantization("torchao-int8", 8, "torchao", _TORCHAO, ("cuda", "cpu"), 1.0,
                 "torchao int8 weight-only, a scale per output channel"),
    Quantization("torchao-int4", 4, "torchao", _TORCHAO, ("cuda",), 0.5 + 4 / _INT4_GROUP,
                 f"torchao int4 weight-only, groups of {_INT4_GROUP} (tinygemm)", ("bfloat16",)),
    Quantization("torchao-fp8", 8, "torchao", _TORCHAO, ("cuda", "cpu"), 1.0,
                 "torchao float8 weight-only, a scale per output channel"),
    Quantization("bnb-int8", 8, "bitsandbytes", _BNB, ("cuda", "cpu"), 1.0,
                 "bitsandbytes LLM.int8, a scale per output channel", parity_rtol=2e-3),
    Quantization("bnb-nf4", 4, "bitsandbytes", _BNB, ("cuda", "cpu"), 0.5 + 4 / _NF4_BLOCK,
                 f"bitsandbytes nf4, blocks of {_NF4_BLOCK}", experts=True),
)}
GENERIC_MODES = ("8bit", "4bit")
QUANTIZED_MODES = GENERIC_MODES + tuple(SCHEMES)

#: (device type, bits) -> schemes in the order "8bit" / "4bit" try them (the first whose library is installed).
#: bitsandbytes first: one library behind a mode on CUDA and the CPU (the CPU parity tests run what a GPU serves),
#: imported only for its modes, where an installed torchao slows every model load (docs/benchmarks/quantized-weights.md).
PREFERENCE: dict[tuple[str, int], tuple[str, ...]] = {
    ("cuda", 8): ("bnb-int8", "torchao-int8"),
    ("cuda", 4): ("bnb-nf4", "torchao-int4"),
    ("cpu", 8): ("bnb-int8", "torchao-int8"),
    ("cpu", 4): ("bnb-nf4",),
}
_BITS = {"8bit": 8, "4bit": 4}
PREQUANTIZED = "prequantized:"
_DENSE_LABEL = "bf16/fp32 weights as stored"


def is_quantized_mode(mode: str) -> bool:
    """Whether ``mode`` is one of this module's weights modes (not dense, int8 on the CPU's own runtime, gguf), or
    ``prequantized:<method>`` (what ``mode_of`` says of a checkpoint published quantized)."""
    return mode in QUANTIZED_MODES or mode.startswith(PREQUANTIZED)


def installed(library: str) -> bool:
    """Whether ``library`` can be imported here (looked up, not imported: torchao's import takes seconds)."""
    return importlib.util.find_spec(library) is not None


def resolve(mode: str, device: str = "cuda", *, check_installed: bool = True, dtype: str | None = None
            ) -> Quantization:
    """The scheme ``mode`` loads on ``device`` (a torch device string or type), computing in ``dtype`` (a torch
    dtype's name; None: any). ``InputError`` where the device or dtype cannot run it or, with ``check_installed``,
    its library is missing (naming the pip command)."""
    device_type = device.partition(":")[0]
    if mode in SCHEMES:
        scheme = SCHEMES[mode]
        if device_type not in scheme.devices:
            raise InputError(f"--weights {mode} runs on {' or '.join(scheme.devices)}, not {device_type}; "
                             f"use --weights {scheme.bits}bit")
        if check_installed and not installed(scheme.library):
            raise InputError(f"--weights {mode} needs {scheme.library}: pip install {scheme.pip}")
        if dtype is not None:
            check_dtype(scheme, dtype)
        return scheme
    if mode not in _BITS:
        raise InputError(f"{mode!r} is not a quantized weights mode; use one of {', '.join(QUANTIZED_MODES)}")
    names = tuple(name for name in PREFERENCE.get((device_type, _BITS[mode]), ())
                  if dtype is None or not SCHEMES[name].dtypes or dtype in SCHEMES[name].dtypes)
    if not names:
        raise InputError(f"--weights {mode} runs on a CUDA GPU or the CPU, not {device_type}"
                         + (f" in {dtype}" if dtype else ""))
    if not check_installed:
        return SCHEMES[names[0]]
    for name in names:
        if installed(SCHEMES[name].library):
            return SCHEMES[name]
    pips = " or ".join(f"pip install {SCHEMES[name].pip}" for name in names)
    raise InputError(f"--weights {mode} needs a quantization library: {pips}")


def quantization_config(scheme: Quantization, dtype: Any, device: str = "cuda",
                        skeleton: Callable[[], Any] | None = None) -> Any:
    """The transformers quantization config that loads ``scheme`` on ``device`` computing in ``dtype`` (a torch
    dtype). ``skeleton`` builds the model without storage (the meta device), asked where some linear layers may be
    too narrow for the library's kernel there (``layers_left_dense``). Imports the library (call ``resolve``
    first: it says what to install)."""
    import transformers

    if scheme.library == "torchao":
        from torchao.quantization import Float8WeightOnlyConfig, Int4WeightOnlyConfig, Int8WeightOnlyConfig

        method = {"torchao-int8": lambda: Int8WeightOnlyConfig(),
                  # tinygemm's layout: the int4 kernel torch itself ships for CUDA (the default needs mslk)
                  "torchao-int4": lambda: Int4WeightOnlyConfig(group_size=_INT4_GROUP,
                                                               int4_packing_format="tile_packed_to_4d"),
                  "torchao-fp8": lambda: Float8WeightOnlyConfig()}[scheme.name]()
        return transformers.TorchAoConfig(method)
    if scheme.name == "bnb-int8":
        _once(logging.getLogger("bitsandbytes.autograd._functions"))
        return transformers.BitsAndBytesConfig(load_in_8bit=True)
    model = skeleton() if skeleton is not None else None
    narrow = layers_left_dense(model, scheme, device) if model is not None else []
    # A skip list replaces transformers' default one (the lm_head); names are patterns to it, hence escaped.
    skip = ["lm_head", *(re.escape(name) for name in narrow)] if narrow else None
    nf4 = dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype,
               bnb_4bit_quant_storage="uint8", llm_int8_skip_modules=skip)
    if model is not None and quantized_experts.has_fused_experts(model):  # the experts in nf4 too, as they load
        return quantized_experts.experts_config(**nf4)
    return transformers.BitsAndBytesConfig(**nf4)


class _FirstOnly(logging.Filter):
    """Lets a logger's message through once per distinct format: bitsandbytes' int8 matmul logs "inputs will be cast
    to float16" at every call of every layer whose input is not fp16 (a bf16 model's too), ~200 lines a token."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        fresh = str(record.msg) not in self.seen
        self.seen.add(str(record.msg))
        return fresh


def _once(log: logging.Logger) -> None:
    if not any(isinstance(f, _FirstOnly) for f in log.filters):
        log.addFilter(_FirstOnly())


def _packs_rows(scheme: Quantization, device: str) -> bool:
    return scheme.name == "bnb-nf4" and device.startswith("cpu")


def layers_left_dense(model: Any, scheme: Quantization, device: str) -> list[str]:
    """The linear layers of ``model`` that ``scheme`` cannot compute on ``device``, left in the compute dtype:
    bitsandbytes' CPU nf4 kernel packs output rows in 32s and reads inputs in blocks of 64 (a narrower layer fails
    at its first forward: a tiny model's 96-wide feed-forward, a linear-attention layer's few gate heads)."""
    if not _packs_rows(scheme, device):
        return []
    from torch import nn

    left = [name for name, module in model.named_modules() if isinstance(module, nn.Linear) and name != "lm_head"
            and (module.out_features % _CPU_NF4_ROWS or module.in_features % _NF4_BLOCK)]
    if left:
        logger.info("bnb-nf4 on the CPU: %d linear layers too narrow for its kernel stay dense (%s...)", len(left),
                    left[0])
    return left


def check_dtype(scheme: Quantization, dtype_name: str) -> None:
    """``InputError`` unless ``scheme`` computes in ``dtype_name`` (a ``torch.dtype`` name without ``torch.``)."""
    if scheme.dtypes and dtype_name not in scheme.dtypes:
        raise InputError(f"--weights {scheme.name} computes in {' or '.join(scheme.dtypes)}, not {dtype_name}; "
                         "leave --dtype on auto")


def prequantized_method(config: Any) -> str | None:
    """The quantization a checkpoint was published in (its config's ``quantization_config``: ``"awq"``,
    ``"gptq"``, ``"compressed-tensors"``, ``"fp8"``...), or None for plain weights."""
    quant = getattr(config, "quantization_config", None)
    if quant is None:
        return None
    method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
    method = getattr(method, "value", method)  # transformers' QuantizationMethod is a str enum
    return str(method) if method else "quantized"


def mode_of(model: Any) -> str | None:
    """The weights mode a loaded transformers model is quantized in (a ``SCHEMES`` name, or ``"prequantized:
    <method>"`` for a checkpoint published quantized), or None when it is not quantized by transformers."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        return None
    quant = quantizer.quantization_config
    method = str(getattr(quant.quant_method, "value", quant.quant_method))
    if getattr(quantizer, "pre_quantized", False):  # the folder held quantized weights: loaded as they are
        return f"{PREQUANTIZED}{method}"
    if method == "bitsandbytes":
        return "bnb-int8" if quant.load_in_8bit else "bnb-nf4"
    if method == quantized_experts.METHOD:
        return "bnb-nf4"
    if method == "torchao":
        kind = type(quant.quant_type).__name__
        return {"Int8WeightOnlyConfig": "torchao-int8", "Int4WeightOnlyConfig": "torchao-int4",
                "Float8WeightOnlyConfig": "torchao-fp8"}.get(kind, f"torchao:{kind}")
    return f"{PREQUANTIZED}{method}"


#: the words of the modes that are not a library's scheme (``label``)
GGUF_LABEL = "GGUF blocks (exact to the GGUF file; a lossy copy of the bf16 model)"
INT8_LABEL = "int8 weights (a scale per output channel; a lossy copy of the model's weights)"


def label(mode: str, *, experts: bool = False) -> str:
    """What the weights are, in the words the header, the plan panel, the picker and the first-pick card all show,
    for a weights mode: a ``SCHEMES`` name, ``"8bit"``/``"4bit"`` (the scheme CUDA takes first, as the picker plans),
    ``prequantized:<method>``, ``int8``, ``gguf`` or dense. ``experts``: the model has fused MoE experts, which only
    ``bnb-nf4`` quantizes (``quantized_experts``)."""
    if mode in _BITS:
        mode = PREFERENCE[("cuda", _BITS[mode])][0]
    if mode in SCHEMES:
        scheme = SCHEMES[mode]
        text = scheme.label()
        if experts:  # the experts are most of a MoE's bytes: say whether they are quantized too
            held = "in nf4 too" if scheme.experts else "left dense"
            text = text.replace("; a lossy copy", f"; the MoE experts {held}; a lossy copy")
        return text
    if mode.startswith("prequantized:"):
        return f"{mode.partition(':')[2]} weights as the checkpoint was published (quantized by its publisher)"
    return {"int8": INT8_LABEL, "gguf": GGUF_LABEL}.get(mode, _DENSE_LABEL)


def is_lossy(mode: str) -> bool:
    """Whether weights held in ``mode`` are a lossy copy of the model's own (a published quantized checkpoint is
    the model as its publisher made it)."""
    return mode not in ("dense", "") and not mode.startswith("prequantized:")


def bytes_per_weight(mode: str, device: str = "cuda", dtype_bytes: int = 2) -> float | None:
    """The bytes one weight of a linear layer holds in ``mode`` on ``device`` (scales included): ``dtype_bytes``
    dense, 1.0 for the 8-bit schemes (the CPU's own ``int8`` too), 0.5625 for nf4, 0.53125 for torchao int4;
    ``"8bit"``/``"4bit"`` as the scheme ``PREFERENCE`` puts first on that device. None for ``"gguf"``: a GGUF
    file's blocks hold what the file does (its size is the figure). For the planner and the picker: no import."""
    if mode in ("dense", "auto") or mode.startswith("prequantized:"):
        return float(dtype_bytes)
    if mode == "int8":
        return 1.0
    if mode == "gguf":
        return None
    return resolve(mode, device, check_installed=False).bytes_per_weight


def held_weight_bytes(mode: str, num_params: int, kept_dense: int = 0, *, experts: int = 0, device: str = "cuda",
                      dtype_bytes: int = 2) -> int:
    """A model's weight bytes in ``mode``: ``kept_dense`` (embeddings, lm_head: ``kept_dense_params``) in
    ``dtype_bytes``, ``experts`` (fused MoE experts: ``fused_experts_params``) quantized where the mode's scheme
    quantizes them (``Quantization.experts``) else in ``dtype_bytes``, the rest at ``bytes_per_weight``."""
    per_weight = bytes_per_weight(mode, device, dtype_bytes)
    if per_weight is None:
        raise InputError("a GGUF model holds its file's bytes; plan it with the file's size")
    if per_weight == dtype_bytes:
        return int(num_params * dtype_bytes)
    if not (mode in QUANTIZED_MODES and resolve(mode, device, check_installed=False).experts):
        kept_dense += experts
    kept = min(kept_dense, num_params)
    return int((num_params - kept) * per_weight + kept * dtype_bytes)


def kept_dense_params(config: Any) -> int:
    """The weights every scheme leaves in the compute dtype, from a config alone: the input embedding and an untied
    lm_head."""
    config = _text(config)
    hidden, vocab = int(config.hidden_size), int(config.vocab_size)
    return vocab * hidden * (1 if getattr(config, "tie_word_embeddings", False) else 2)


def fused_experts_params(config: Any) -> int:
    """The weights of transformers' fused MoE experts, from a config alone (``engine.planning.shape``'s count):
    dense but in ``bnb-nf4`` (``held_weight_bytes``' ``experts``)."""
    from ..planning.shape import fused_experts_params as count

    return count(config)


def fused_experts_scratch(config: Any, dtype_bytes: int = 2) -> int:
    """The bytes ``bnb-nf4``'s routed experts expand into at most, from a config alone: a group's up and down
    weights (``quantized_experts.SCRATCH_BYTES``, or one expert where larger, or a layer's experts where fewer)."""
    config = _text(config)
    if not fused_experts_params(config):
        return 0
    experts = int(getattr(config, "num_experts", None) or config.num_local_experts)
    width = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
    per_expert = 3 * int(config.hidden_size) * int(width) * dtype_bytes
    return min(experts, max(1, quantized_experts.SCRATCH_BYTES // per_expert)) * per_expert


def _text(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def choose_gpu_weights(num_params: int, gpu_budget: int, working_bytes: int, kept_dense: int = 0,
                       device: str = "cuda", *, experts: int = 0, scratch_bytes: int = 0) -> str:
    """``weights="auto"`` on a GPU: ``"dense"`` (bf16) where the weights fit within ``gpu_budget`` beside the
    plan's ``working_bytes`` (a minimal document's KV buffers and activations), else ``"8bit"`` where those and
    its ``scratch_bytes`` (what a quantized weight widens into: ``expansion_scratch``) fit, else ``"4bit"`` (whose
    plan then says what does not fit). ``experts``: as ``held_weight_bytes`` takes it."""
    if held_weight_bytes("dense", num_params, kept_dense, experts=experts, device=device) + working_bytes \
            <= gpu_budget:
        return "dense"
    if held_weight_bytes("8bit", num_params, kept_dense, experts=experts, device=device) + working_bytes \
            + scratch_bytes <= gpu_budget:
        return "8bit"
    return "4bit"


def expansion_scratch(config: Any) -> int:
    """GPU bytes a quantized linear weight widens into while its matmul runs (torchao's int8 path widens a copy,
    nf4 and GGUF blocks dequantize a layer at a time): the feed-forward's gate and up weights in bf16, or the
    routed nf4 experts' group where larger (``fused_experts_scratch``)."""
    text = _text(config)
    width = max(int(text.intermediate_size), int(getattr(text, "moe_intermediate_size", None) or 0))
    return max(2 * int(text.hidden_size) * width * 2, fused_experts_scratch(text))


def working_bytes(shape: Any) -> int:
    """GPU bytes besides the weights that a minimal document needs: one default chunk's KV buffers and
    activations as the planner sizes them (``shape``: a ``ModelShape``)."""
    from ..planning.planner import make_plan
    from ..planning.policy import OffloadPolicy

    policy = OffloadPolicy()
    return make_plan(replace(shape, weight_bytes=0), policy, policy.chunk_size, device_is_cuda=True,
                     gpu_budget=None, host_budget=None).gpu_bytes


def auto_gpu_weights(config: Any, shape: Any, gpu_budget: int, device: str = "cuda") -> str:
    """The one ``weights="auto"`` rule on a GPU, for the loader (``_auto_on_gpu``) and the picker
    (``catalogue.gpu_weights``): ``choose_gpu_weights`` over ``shape``'s parameters, its ``working_bytes`` and
    ``config``'s ``expansion_scratch``, within ``gpu_budget`` (``planning.budgets.gpu_budget``)."""
    return choose_gpu_weights(shape.num_params, gpu_budget, working_bytes(shape), kept_dense_params(config), device,
                              experts=fused_experts_params(config), scratch_bytes=expansion_scratch(config))


def load_mode(weights: str, config: Any, device: str, dtype: Any) -> str:
    """The weights mode ``load_model`` loads a (non-GGUF) model of ``config`` in: a ``SCHEMES`` name for a
    quantized mode or for ``auto`` on a GPU the bf16 weights do not fit (``choose_gpu_weights``), ``prequantized:
    <method>`` for a checkpoint published quantized (with ``auto``/``dense``; a quantized mode is refused: it is
    quantized already), else ``weights`` unchanged. ``dtype``: the torch dtype the model computes in."""
    dtype_name = str(dtype).removeprefix("torch.")
    method = prequantized_method(config)
    if method is not None:
        if weights in QUANTIZED_MODES:
            raise InputError(f"this checkpoint is published quantized ({method}); it loads as it is with "
                             f"--weights auto, not --weights {weights}")
        if weights in ("int8", "gguf"):
            raise InputError(f"--weights {weights} requantizes dense weights, and this checkpoint is {method}")
        return f"{PREQUANTIZED}{method}"
    if weights.startswith(PREQUANTIZED):
        raise InputError(f"--weights {weights}: this checkpoint is not published quantized")
    if weights in QUANTIZED_MODES:
        return resolve(weights, device, dtype=dtype_name).name
    if weights != "auto" or not device.startswith("cuda"):
        return weights
    wanted = _auto_on_gpu(config, device)
    if wanted == "dense":
        return "dense"
    try:
        return resolve(wanted, device, dtype=dtype_name).name
    except InputError as error:
        raise InputError(f"the bf16 weights do not fit this GPU beside the working buffers, and {error}; or pass "
                         "--weights dense to try anyway") from None


def _auto_on_gpu(config: Any, device: str, cuda: Any = None) -> str:
    """``auto_gpu_weights`` for ``config`` on ``device``: its free memory less the default reserve
    (``planning.budgets.gpu_budget``; none of ours given back: in a switch the old model serves until the new one
    is in). ``cuda``: ``torch.cuda`` or a stand-in with ``mem_get_info`` (tests)."""
    import torch

    from ..planning.budgets import gpu_budget
    from ..planning.policy import OffloadPolicy
    from ..planning.shape import ModelShape

    free, _total = (cuda or torch.cuda).mem_get_info(torch.device(device))
    budget = gpu_budget(free, 0, OffloadPolicy().gpu_reserve)
    shape = ModelShape.from_config(config)
    mode = auto_gpu_weights(config, shape, budget, device)
    logger.info("Weights auto on %s: %s (%.1fB weights, %.2f GiB free, %.2f GiB budget)", device, mode,
                shape.num_params / 1e9, free / 2**30, budget / 2**30)
    return mode
