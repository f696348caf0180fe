"""Converted CPU weights kept on disk, so a bf16, int8 or gguf model loads its own bytes and never an fp32 copy first.

Loading a bf16 or int8 CPU model from fp32 safetensors (every converted GGUF is fp32) maps or materialises the
fp32 weights while the bf16 copy or the int8 codes are built: about twice the memory the model finally holds, and
for int8 a quantization pass on every start. The first load in a mode therefore saves the converted state (int8:
codes, scales, biases and every other tensor in bf16; gguf: the file's blocks in the layers' row order, the rest
in fp32, and the layout of block layers in the manifest; dense: the bf16 state) into
``cache_dir()/"models"/<name>-<mode>-<key>``; later loads build the model on the meta device (no storage), swap in
the int8 layers, and assign the saved tensors memory-mapped, never allocating a dense weight.

Every parameter and buffer is saved, non-persistent ones too (rotary ``inv_freq``, Gemma's ``embed_scale``): the
cached model then holds bit for bit the tensors of the model it was saved from, whatever transformers computes
when it initialises a buffer. A tensor registered under two names (a tied lm_head) is saved once and tied again by
identity on load. The key covers the source folder (resolved path; names, sizes and mtimes of its weight and
config files), the mode and the code that produced the tensors (transformers, torch, the int8 quantizer's source),
so any change converts again. An entry only appears under its final name once complete; one that fails to load is
deleted and rebuilt. Multimodal Gemma 3 checkpoints are cached as the text model the loader keeps.

A GGUF file's blocks (``gguf_entry``) are keyed by the file itself, not by the fp32 folder converted from it, and
the entry holds the folder's config and tokenizer files too: it is all a later load reads, so the fp32 folder (4
bytes a weight: docs/benchmarks/gguf-weights.md) is not kept once the blocks are saved, and the entry is found
before any conversion. Its key names the file (resolved path, size, modification time), transformers and torch's
version (they produce the tensors kept dense; not torch's CPU or CUDA build) and ``GGUF_FORMAT``; not the kernels'
source: the blocks are the file's bytes, whatever code multiplies them, so an edit of the C kernels does not save
them again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import StaleWeightsCache
from ..paths_windows import ntfs_name
from ..cpu import gguf_blocks, int8

logger = logging.getLogger(__name__)

#: Bump when what an entry holds changes: old keys then miss. (Edits of ``engine.cpu.int8`` change int8 keys anyway.)
CACHE_FORMAT = 1
WEIGHTS_FILE = "weights.safetensors"
MANIFEST_FILE = "headinfer-weights.json"  # names our entries apart from the other folders under models/
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json")
_CONFIG_FILES = ("config.json", "generation_config.json")
_MODE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
_SAFETENSORS_FLOATS = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
_SAFETENSORS_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16"}
# Weights modes that change the layers, and the code whose edit invalidates their entries.
_QUANTIZED = {"int8": (Path(int8.__file__),)}
#: Bump when what a GGUF entry holds changes (``BlockLinear``'s or ``BlockEmbedding``'s saved tensors, the files kept
#: beside them): old keys then miss. A layout the skeleton cannot rebuild fails to load and is rebuilt anyway.
GGUF_FORMAT = 1


@dataclass(frozen=True)
class CacheEntry:
    """Where one source's weights in one mode are (or will be) kept."""

    folder: Path  # cache_dir()/models/<name>-<mode>-<key>: exists only once complete
    source: Path  # the resolved source folder the tensors were converted from
    mode: str  # "int8", "gguf", "bf16" or "fp16"


def cache_entry(models_dir: Path, source: Path, name: str, dtype: torch.dtype, weights: str) -> CacheEntry | None:
    """The entry for ``source`` loaded as ``weights`` in ``dtype`` on the CPU, or None where caching gains nothing.

    None for fp32 (the source folder already is fp32: nothing to convert), for a folder without weight files, and
    for dense weights the folder already stores in ``dtype`` (a copy would read the same bytes from another file).
    """
    mode = weights if weights in _QUANTIZED else _MODE_NAMES.get(dtype)
    files = _key_files(source)
    if mode is None or not any(path.name.endswith(_WEIGHT_SUFFIXES) for path in files):
        return None
    if weights not in _QUANTIZED and _stored_in(files, dtype):
        return None
    resolved = source.resolve()
    lines = [f"format {CACHE_FORMAT}", f"transformers {transformers.__version__}", f"torch {torch.__version__}",
             str(resolved), mode, str(dtype)]
    for code in _QUANTIZED.get(weights, ()):  # an edit of the quantizer (or its layers) must not reuse its output
        lines.append(hashlib.sha256(code.read_bytes()).hexdigest())
    for path in files:
        stat = path.stat()
        lines.append(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}")
    key = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]
    return CacheEntry(models_dir / f"{ntfs_name(name)}-{mode}-{key}", resolved, mode)  # a hub or file name: NTFS-safe


def gguf_entry(models_dir: Path, gguf: Path, name: str) -> CacheEntry:
    """The entry of ``gguf``'s blocks (``weights="gguf"``), keyed by the file itself: see the module docstring."""
    resolved = gguf.resolve()
    stat = resolved.stat()
    # torch's build (+cpu, +cu128) is left out: the CPU-only install the README gives and a CUDA one convert alike,
    # and switching between them must not save 1.6 GB again.
    lines = [f"format {CACHE_FORMAT}", f"gguf {GGUF_FORMAT}", f"transformers {transformers.__version__}",
             f"torch {torch.__version__.split('+')[0]}", str(resolved), f"{stat.st_size}:{stat.st_mtime_ns}"]
    key = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]
    return CacheEntry(models_dir / f"{ntfs_name(name)}-gguf-{key}", resolved, "gguf")


def load_cached(entry: CacheEntry, skeleton: Callable[[dict[str, int]], nn.Module], *,
                just_saved: bool = False) -> nn.Module | None:
    """The model saved in ``entry``, on the CPU, or None when there is none yet or it cannot be read.
    ``just_saved``: the caller saved it a moment ago (no cache hit to report).

    ``skeleton(layout)`` builds the model's modules on the meta device (int8 layers swapped in, GGUF block layers
    where ``layout``, the saved ``gguf_blocks.block_layout``, says); the saved tensors are assigned to it
    memory-mapped. An entry that fails is deleted (with a warning) so the caller's slow load rebuilds it.
    """
    if not entry.folder.is_dir():  # only a finished entry is ever renamed to this name
        return None
    try:
        model = skeleton(json.loads((entry.folder / MANIFEST_FILE).read_text()).get("blocks", {}))
        _assign(model, entry.folder)
    except Exception as err:  # a truncated file, a layout that changed: the source can always be read again
        logger.warning("Converted weights in %s cannot be loaded (%s: %s); deleting them and %s", entry.folder,
                       type(err).__name__, err, "keeping the model as converted" if just_saved
                       else f"loading {entry.source} again")
        shutil.rmtree(entry.folder, ignore_errors=True)
        return None
    if just_saved:
        logger.debug("Mapped the %s weights just saved to %s", entry.mode, entry.folder)
    else:
        logger.info("Loaded %s weights of %s from the converted-weights cache %s", entry.mode, entry.source,
                    entry.folder)
    return model


def save_cached(entry: CacheEntry, model: nn.Module, files_from: Path | None = None) -> bool:
    """Saves ``model``'s tensors into ``entry``, atomically, and drops entries it replaces; ``files_from``: a model
    folder whose other files (config, generation config, tokenizer) are copied beside them, so the entry loads
    alone. True once saved. Never raises: a model that cannot be saved (tensors sharing memory under other shapes,
    a full disk) loads the slow way next time."""
    entry.folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=entry.folder.parent, prefix=f".{entry.folder.name}-"))
    try:
        tensors, ties = _unique_tensors(model)
        save_file(tensors, str(scratch / WEIGHTS_FILE))
        for path in _companion_files(files_from):
            shutil.copy2(path, scratch / path.name)
        manifest = {"format": CACHE_FORMAT, "source": str(entry.source), "mode": entry.mode, "ties": ties,
                    "blocks": gguf_blocks.block_layout(model)}
        (scratch / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))
        try:
            # The entry only appears, under its final name, once everything is written.
            os.rename(scratch, entry.folder)
        except OSError:
            if not entry.folder.is_dir():
                raise
            logger.info("Another process cached %s first; using its copy", entry.folder.name)
        logger.info("Saved %s weights of %s to %s", entry.mode, entry.source, entry.folder)
        _prune(entry)
        return True
    except Exception as err:
        logger.warning("Could not cache the %s weights of %s in %s (%s: %s); the next load converts again",
                       entry.mode, entry.source, entry.folder, type(err).__name__, err)
        return False
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def entries_from(models_dir: Path, source: Path, mode: str) -> list[Path]:
    """The entries of ``mode`` converted from ``source`` (a folder), by their manifests."""
    found = []
    for folder in models_dir.iterdir() if models_dir.is_dir() else ():
        try:
            manifest = json.loads((folder / MANIFEST_FILE).read_text())
        except (OSError, ValueError):
            continue
        if manifest.get("mode") == mode and Path(manifest.get("source", "")) == source.resolve():
            found.append(folder)
    return found


def _companion_files(folder: Path | None) -> list[Path]:
    """``folder``'s files other than weights: what ``from_pretrained`` reads beside them."""
    if folder is None:
        return []
    return sorted(path for path in folder.iterdir() if path.is_file() and not path.name.endswith(_WEIGHT_SUFFIXES))


def _key_files(source: Path) -> list[Path]:
    """The source's files whose change changes the model: weights, their index, the configs (sorted)."""
    return sorted(path for path in source.iterdir()
                  if path.is_file() and (path.name.endswith(_WEIGHT_SUFFIXES) or path.name in _CONFIG_FILES))


def _stored_in(files: list[Path], dtype: torch.dtype) -> bool:
    """True when every floating tensor of the source's safetensors is stored in ``dtype`` (and there are no other
    weight formats): loading in ``dtype`` then converts nothing. Reads the files' JSON headers only."""
    wanted = _SAFETENSORS_DTYPES.get(dtype)
    weights = [path for path in files if path.name.endswith(_WEIGHT_SUFFIXES) and not path.name.endswith(".json")]
    if wanted is None or not weights or any(not path.name.endswith(".safetensors") for path in weights):
        return False
    for path in weights:
        with open(path, "rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(length))
        floats = {spec["dtype"] for name, spec in header.items() if name != "__metadata__"} & _SAFETENSORS_FLOATS
        if floats - {wanted}:
            return False
    return True


def _named_tensors(model: nn.Module):
    """``(name, module, attribute, tensor, is parameter)`` for every parameter and buffer, under every name."""
    for module_name, module in model.named_modules(remove_duplicate=False):
        prefix = f"{module_name}." if module_name else ""
        for attr, tensor in module._parameters.items():
            if tensor is not None:
                yield f"{prefix}{attr}", module, attr, tensor, True
        for attr, tensor in module._buffers.items():
            if tensor is not None:
                yield f"{prefix}{attr}", module, attr, tensor, False


def _unique_tensors(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``(name -> tensor, each once; alias name -> name of the same tensor)``."""
    first: dict[int, str] = {}
    tensors: dict[str, torch.Tensor] = {}
    ties: dict[str, str] = {}
    for name, _, _, tensor, _ in _named_tensors(model):
        if id(tensor) in first:
            ties[name] = first[id(tensor)]
        else:
            first[id(tensor)] = name
            tensors[name] = tensor.detach()
    return tensors, ties


def _assign(model: nn.Module, folder: Path) -> None:
    """Replaces every (meta) tensor of ``model`` by the saved one, tied names by the very same object."""
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    if manifest.get("format") != CACHE_FORMAT:
        raise StaleWeightsCache(f"cache format {manifest.get('format')}, expected {CACHE_FORMAT}")
    ties: dict[str, str] = manifest["ties"]
    saved = load_file(str(folder / WEIGHTS_FILE))  # memory-mapped: pages are read as the tensors are used
    loaded: dict[str, torch.Tensor] = {}
    named = list(_named_tensors(model))
    for name, module, attr, old, is_parameter in named:
        if name in ties:
            continue
        tensor = saved.pop(name)  # KeyError: the model has a tensor the entry lacks
        if tensor.shape != old.shape:
            raise StaleWeightsCache(f"{name} is {tuple(tensor.shape)} in the cache, {tuple(old.shape)} in the model")
        if is_parameter:
            tensor = nn.Parameter(tensor, requires_grad=old.requires_grad)
        (module._parameters if is_parameter else module._buffers)[attr] = tensor
        loaded[name] = tensor
    if saved:
        raise StaleWeightsCache(f"{len(saved)} cached named the model does not have, e.g. {next(iter(saved))}")
    for name, module, attr, _, is_parameter in named:
        if name in ties:
            (module._parameters if is_parameter else module._buffers)[attr] = loaded[ties[name]]
    _check_no_meta(model)


def _check_no_meta(model: nn.Module) -> None:
    """Raises when a tensor of ``model`` still has no storage: one the cache did not hold, held outside the
    parameters and buffers (a plain tensor attribute), would fail at the first forward instead of here."""
    for module_name, module in model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor) and value.device.type == "meta":
                raise StaleWeightsCache(f"{module_name or 'model'}.{attr} is not in the cache")
    for name, _, _, tensor, _ in _named_tensors(model):
        if tensor.device.type == "meta":
            raise StaleWeightsCache(f"{name} is not in the cache")


def _prune(entry: CacheEntry) -> None:
    """Deletes the entries ``entry`` replaces (same source and mode, older key) and those whose source (a folder, or
    a GGUF file) is gone: each holds a whole model's weights, and nothing could ever load them again."""
    for folder in entry.folder.parent.iterdir():
        manifest_path = folder / MANIFEST_FILE
        # A ".name-" scratch folder belongs to a save in progress, possibly another process's.
        if folder == entry.folder or folder.name.startswith(".") or not manifest_path.is_file():
            continue
        try:
            manifest = json.loads(manifest_path.read_text())
            source = Path(manifest["source"])
            stale = (source == entry.source and manifest["mode"] == entry.mode) or not source.exists()
        except (OSError, ValueError, KeyError):
            stale = False  # another process may be writing it: leave it
        if stale:
            logger.info("Deleting converted weights %s (source %s changed or gone)", folder, source)
            shutil.rmtree(folder, ignore_errors=True)
