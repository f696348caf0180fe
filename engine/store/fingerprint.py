"""Fingerprints that say whether a saved KV cache belongs to a model, a tokenizer and a document.

A KV cache is only valid for the exact weights, dtype and token ids that produced it, so a snapshot
records all three, and the weights mode (dense, int8 codes or GGUF blocks: ``engine.models.weights_mode.weights_mode``). Each fingerprint is cheap (no pass over the weights): the model's config, the
identity of its weight files and a small sample of its parameters; the tokenizer's vocabulary size,
chat template and the ids of a few probe strings; a SHA-256 of the document's token ids.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..models.weights_mode import weights_mode

FINGERPRINT_CHARS = 32  # hex characters kept of each SHA-256
TOKEN_ID_DTYPE = "<u4"  # how token ids are hashed and stored: little-endian uint32

# Config entries that change with how a model was loaded, not with what it computes.
_VOLATILE_CONFIG_KEYS = frozenset({
    "_attn_implementation", "_attn_implementation_autoset", "_attn_implementation_internal",
    "attn_implementation", "_name_or_path", "name_or_path", "_commit_hash", "transformers_version",
    "dtype", "torch_dtype", "use_cache", "output_attentions", "output_hidden_states", "return_dict",
    "experts_implementation",
})
_WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth")
_SAMPLE_ELEMENTS = 4096  # per sampled parameter: a few KB, enough to tell any two trained models apart
_TOKENIZER_PROBES = (
    "Hello, world!",
    " The quick brown fox jumps over 13 lazy dogs.",
    "naïve café — 日本語 🙂",
    "\n\n\t  indented\r\nlines",
    "<|im_start|>user\n[page 3]",
)


@dataclass(frozen=True)
class ModelFingerprint:
    """What identifies a model's weights; two fingerprints are equal when the KV they produce is."""

    model_type: str
    name: str  # for messages only: the folder or Hub id it was loaded from
    config: str
    weights: str
    weights_mode: str = "dense"  # "int8"/"gguf": quantized linear layers (headers saved before modes existed: dense)

    def describe(self) -> str:
        mode = "" if self.weights_mode == "dense" else f"{self.weights_mode} "
        return (f"{self.model_type} model {self.name or '(unnamed)'!r} (config {self.config[:8]}, "
                f"{mode}weights {self.weights[:8]})")

    def difference(self, other: ModelFingerprint) -> str | None:
        """Why ``other`` is not this model, in words; None when it is."""
        if self.model_type != other.model_type:
            return f"a {self.model_type} model, not {other.model_type}"
        if self.config != other.config:
            return "a model with another configuration"
        if self.weights_mode != other.weights_mode:
            return f"{self.weights_mode} weights, not {other.weights_mode}"
        if self.weights != other.weights:
            return "a model with other weights"
        return None


def model_fingerprint(model) -> ModelFingerprint:
    """Fingerprints ``model`` from its config, its weight files (local folders) and a parameter sample."""
    config = model.config
    name = str(getattr(config, "_name_or_path", "") or getattr(model, "name_or_path", "") or "")
    weights = hashlib.sha256()
    weights.update(_weight_files_digest(name).encode())
    weights.update(_parameter_sample_digest(model).encode())
    return ModelFingerprint(str(getattr(config, "model_type", "")), name, _config_digest(config),
                            weights.hexdigest()[:FINGERPRINT_CHARS], weights_mode(model))


def tokenizer_fingerprint(tokenizer) -> str:
    """Vocabulary size, chat template, special tokens and the ids of a few probe strings."""
    data = {
        "vocab_size": len(tokenizer),
        "chat_template": getattr(tokenizer, "chat_template", None),
        "special_ids": sorted(int(i) for i in getattr(tokenizer, "all_special_ids", []) or []),
        "probes": [list(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in _TOKENIZER_PROBES],
    }
    return _digest(json.dumps(data, sort_keys=True, default=str).encode())


def token_ids_bytes(ids: list[int]) -> bytes:
    """The ids as stored in a snapshot's ``tokens.bin`` and hashed for its key."""
    return np.asarray(ids, dtype=TOKEN_ID_DTYPE).tobytes()


def token_ids_digest(ids: list[int]) -> str:
    """SHA-256 (full hex) of the document's token ids."""
    return hashlib.sha256(token_ids_bytes(ids)).hexdigest()


def kv_dtype(model) -> torch.dtype:
    """The dtype the model's K/V come out in: that of its first floating-point parameter."""
    for parameter in model.parameters():
        if parameter.is_floating_point():
            return parameter.dtype
    return torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _config_digest(config) -> str:
    return _digest(json.dumps(_strip_volatile(config.to_dict()), sort_keys=True, default=str).encode())


def _strip_volatile(value):
    if isinstance(value, dict):
        return {k: _strip_volatile(v) for k, v in value.items() if k not in _VOLATILE_CONFIG_KEYS}
    if isinstance(value, list):
        return [_strip_volatile(v) for v in value]
    return value


def _weight_files_digest(name: str) -> str:
    """Names, sizes and modification times of the weight files when ``name`` is a local folder."""
    folder = Path(name).expanduser() if name else None
    if folder is None or not folder.is_dir():
        return ""
    entries = []
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name.endswith(_WEIGHT_SUFFIXES):
            stat = path.stat()
            entries.append(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return _digest("\n".join(entries).encode())


def _parameter_sample_digest(model) -> str:
    """The first elements of the first, middle and last parameters, rounded through bfloat16.

    The rounding makes a float32 model and its bfloat16 cast agree here; the dtype is checked on its own.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.device.type != "meta"]
    if not named:
        return ""
    digest = hashlib.sha256(f"{len(named)}:{sum(p.numel() for _, p in named)}".encode())
    for name, parameter in {id(p): (n, p) for n, p in (named[0], named[len(named) // 2], named[-1])}.values():
        sample = parameter.detach().reshape(-1)[:_SAMPLE_ELEMENTS]
        if sample.is_floating_point():
            sample = sample.to(torch.bfloat16).to(torch.float32)
        digest.update(name.encode())
        digest.update(sample.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:FINGERPRINT_CHARS]
