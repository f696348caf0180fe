"""What a loaded model is, beyond its weights: how it holds them (``weights_mode``: dense, int8 codes, GGUF blocks)
and how ``load_model`` loaded it (``loaded_as``, to load the same weights again in another process). The snapshot
fingerprints, the reading-rate key and the retrieval-head calibration ask here.
"""

from __future__ import annotations

import weakref

import torch

from .quantized import label, mode_of
from .quantized_experts import has_fused_experts


def weights_mode(model) -> str:
    """``"int8"`` when linear layers hold int8 ``codes`` buffers (``engine.cpu.int8.Int8Linear``), ``"gguf"``
    when they hold a GGUF file's ``blocks`` (``engine.cpu.gguf_blocks.BlockLinear``), else ``"dense"``. The K/V
    an int8 model produces differ from the dense model's, in whatever dtype; a gguf model's are the fp32 dense
    model's up to summation order, but its K/V are kept apart all the same (they are not bitwise the same). A model
    transformers quantized (torchao, bitsandbytes, a checkpoint published quantized) is named by
    ``engine.models.quantized.mode_of``: ``"bnb-nf4"``, ``"prequantized:awq"``..."""
    if (quantized := mode_of(model)) is not None:
        return quantized
    for name, buffer in model.named_buffers():
        attr = name.rpartition(".")[2]
        if attr == "codes" and buffer.dtype == torch.int8:
            return "int8"
        if attr == "blocks" and buffer.dtype == torch.uint8:
            return "gguf"
    return "dense"


def weights_label(model) -> str:
    """What ``model``'s weights are, in the words every place a user sees them shows (``quantized.label``)."""
    return label(weights_mode(model), experts=has_fused_experts(model))


#: model -> the ``load_model`` keyword arguments that gave it (``loaded_as``)
_LOADED_AS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def remember_load(model, **arguments) -> None:
    """Notes how ``engine.models.load_model`` loaded ``model`` (it calls this), for ``loaded_as``."""
    _LOADED_AS[model] = arguments


def loaded_as(model) -> dict | None:
    """The ``load_model`` keyword arguments that load the same weights again, in another process (the retrieval-head
    calibration runs there, and fingerprints it as this model); None for a model ``load_model`` did not return."""
    arguments = _LOADED_AS.get(model)
    return None if arguments is None else dict(arguments)
