"""Handing freed memory back to the system after a model is dropped or converted."""

from __future__ import annotations

import gc

import torch

from ..cpu.heap import trim_heap


def release_memory() -> None:
    """Collects dropped objects, empties torch's CUDA cache, and trims the heap (``trim_heap``)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    trim_heap()
