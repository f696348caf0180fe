"""Handing freed memory back to the system after a model is dropped or converted."""

from __future__ import annotations

import ctypes
import gc

import torch


def release_memory() -> None:
    """Collects dropped objects, empties torch's CUDA cache, and trims the heap (``trim_heap``)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    trim_heap()


def trim_heap() -> None:
    """Gives glibc's free heap memory back to the system. glibc keeps freed blocks in its arenas, and a loop that
    frees a large scratch tensor per layer while keeping smaller ones fragments them: converting a 0.5B model held
    1.1 GB of freed scratch (1.6 GB at its peak) until the process ended."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        pass
