"""The first load of a GGUF's blocks straight from the file: no fp32 copy of the model on disk or in memory.

``load_model(weights="gguf")`` keeps a file's blocks in the layers' row order (``engine.cpu.gguf_blocks``). Matching
them needs to know which tensor is which layer's and in what row order: here transformers' own GGUF name map and
tensor processor say so (``engine.models.gguf.StreamedFile``), so each block tensor is taken as the file's bytes
(mapped; a processor's row permutation, Llama's q/k order, permutes block rows) and only the small tensors that are
not blocks (norms, biases, a dense embedding) are dequantized and processed, as the streamed conversion does. The
model is the very one the fp32 folder's load and the block matcher build: the same blocks, the same dense tensors
(tests/engine/test_gguf_direct.py). Where that cannot be shown (an architecture not in ``STREAMED_ARCHITECTURES``,
a tensor left without storage) ``build`` returns None and says why; the loader then goes through the fp32 folder.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..cpu import gguf_blocks
from ..cpu.gguf_blocks import BLOCK_TYPES, BlockLinear, block_targets
from .gguf import StreamedFile, save_config, save_tokenizer, streamed_file
from .gguf_header import read_header

logger = logging.getLogger(__name__)


def write_files(gguf: Path, config: Any, folder: Path) -> StreamedFile | None:
    """Writes what a folder converted from ``gguf`` holds besides its weights (config, generation config,
    tokenizer) into ``folder``, and returns the file's tensors as transformers names them; None (nothing written)
    where the architecture is not read this way. ``config``: the file's, as ``AutoConfig`` parses it."""
    header = read_header(gguf)
    streamed = streamed_file(gguf, header, config)
    if streamed is None:
        logger.info("%s (%s): its first load goes through an fp32 folder (the architecture is not converted one "
                    "tensor at a time)", gguf.name, header.fields.get("general.architecture"))
        return None
    save_config(config, streamed.model, folder)
    save_tokenizer(gguf, folder)
    return streamed


def build(streamed: StreamedFile, skeleton: Callable[[], nn.Module], name: str) -> nn.Module | None:
    """The fp32 CPU model of the file's blocks: ``skeleton()`` (the stock model on the meta device, of the config
    ``write_files`` saved) with each block layer over the file's bytes and every other tensor as stock loading
    holds it; None where a tensor would be left without storage (logged). ``name``: the file, for the log."""
    model = skeleton()
    targets = {f"{layer}.weight": (layer, module, ties) for layer, module, ties in
               block_targets(model) + gguf_blocks._untied_embedding(model)}
    embedding_weight = _name_of(model, model.get_input_embeddings().weight)
    for owner, (layer, module, ties) in list(targets.items()):
        if ties:  # a tied lm_head's weight is the embedding's tensor in the file
            targets[embedding_weight] = targets.pop(owner)
    aliases = _aliases(model)
    state = model.state_dict(keep_vars=True)
    blocks: dict[str, tuple[torch.Tensor, int]] = {}
    for info, raw in streamed.tensors:
        target = streamed.names[info.name]
        if target not in state:
            continue  # a tensor the model does not have: stock loading leaves it out too
        rows = _block_rows(streamed, info, raw) if target in targets else None
        if rows is not None:
            blocks[target] = (rows, info.qtype)
        elif not _assign(model, aliases.get(target, [target]), torch.from_numpy(streamed.dense(info, raw))):
            logger.warning("%s: %s is %s in the file, %s in the model; its first load goes through an fp32 folder",
                           name, target, tuple(reversed(info.shape)), tuple(state[target].shape))
            return None
    _init_buffers(model)
    layout = {}
    for target, (rows, qtype) in blocks.items():
        layer, module, ties = targets[target]
        bias = getattr(module, "bias", None)
        block_layer = BlockLinear(rows, qtype, module.weight.shape[1], None if bias is None else bias.detach())
        layout[gguf_blocks._place(model, layer, module, block_layer, ties)] = qtype
    missing = [key for key, tensor in model.state_dict(keep_vars=True).items() if tensor.device.type == "meta"]
    if missing:
        logger.warning("%s: %d tensors are neither blocks nor in the file (%s); its first load goes through an fp32 "
                       "folder", name, len(missing), ", ".join(missing[:3]))
        return None
    kinds = sorted({BLOCK_TYPES[qtype][0] for qtype in layout.values()})
    logger.info("gguf weights of %s straight from the file: %d layers keep its blocks (%s), %d tensors dequantized",
                name, len(layout), ", ".join(kinds) or "none", len(streamed.tensors) - len(blocks))
    return model.eval()


def _block_rows(streamed: StreamedFile, info: Any, raw: Any) -> torch.Tensor | None:
    """raw's blocks in the state dict's row order ([out, in / block * bytes] uint8: a view of the file's map where
    the order is the file's, else a copy), or None where the tensor is not blocks a layer keeps."""
    if info.qtype not in BLOCK_TYPES or raw.ndim != 2:
        return None
    order = streamed.row_order(info)
    if order is None:
        return None
    rows = torch.from_numpy(raw if raw.flags.writeable else raw.copy())
    if (order == np.arange(len(order))).all():
        return rows
    return rows[torch.from_numpy(order)].contiguous()


def _name_of(model: nn.Module, tensor: torch.Tensor) -> str:
    return next(name for name, param in model.named_parameters(remove_duplicate=False) if param is tensor)


def _aliases(model: nn.Module) -> dict[str, list[str]]:
    """Each parameter's name -> every name of that tensor (a tied lm_head's weight is the embedding's)."""
    by_tensor: dict[int, list[str]] = {}
    for name, tensor in model.named_parameters(remove_duplicate=False):
        by_tensor.setdefault(id(tensor), []).append(name)
    return {name: names for names in by_tensor.values() for name in names}


def _assign(model: nn.Module, names: list[str], value: torch.Tensor) -> bool:
    """Puts ``value`` (fp32, loaded) at every one of ``names`` as one tensor, marked initialised for transformers;
    False (nothing changed) where the model's tensor has another shape."""
    holders = []
    for name in names:
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        store = module._parameters if attr in module._parameters else module._buffers
        if tuple(store[attr].shape) != tuple(value.shape):
            return False
        holders.append((store, attr))
    store, attr = holders[0]
    tensor = nn.Parameter(value, requires_grad=False) if isinstance(store[attr], nn.Parameter) else value
    tensor._is_hf_initialized = True
    for store, attr in holders:
        store[attr] = tensor
    return True


def _init_buffers(model: nn.Module) -> None:
    """The buffers a model computes itself (rotary frequencies, Gemma's ``embed_scale``), as ``from_pretrained``
    fills them: given storage, then transformers' own ``initialize_weights``, which skips every loaded tensor."""
    for module in model.modules():
        for attr, buffer in module._buffers.items():
            if buffer is not None and buffer.device.type == "meta":
                # NaN until filled: a buffer initialize_weights left alone would show in the parity tests
                filler = float("nan") if buffer.is_floating_point() else 0
                module._buffers[attr] = torch.full_like(buffer, filler, device="cpu")
    model.initialize_weights()
