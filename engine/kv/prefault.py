"""Pre-faulting host memory before ``cudaHostRegister``, on a few threads.

A fresh large allocation is only address space: its pages are faulted in (and zeroed by the kernel) on first
touch. ``cudaHostRegister`` would fault every one of them on the calling thread, over a minute of a GPU call at
the H200's sizes (docs/benchmarks/gpu-h200.md). Faulting them first, in slices on a few threads, spreads the
kernel's zeroing over cores; registration then only locks pages that exist. Each slice is populated by
``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14+) or, elsewhere, by writing one byte per page (its own value: the contents are unchanged).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
from concurrent.futures import ThreadPoolExecutor

import torch

logger = logging.getLogger(__name__)

PAGE = mmap.PAGESIZE
BYTES_PER_THREAD = 64 << 20  # below this a thread's start costs more than the faults it takes over
MAX_THREADS = 8  # the kernel's page allocator stops scaling past a few threads
_MADV_POPULATE_WRITE = 23  # linux/mman.h


def num_threads(num_bytes: int) -> int:
    """Threads for ``num_bytes``: one per ``BYTES_PER_THREAD``, at most the cores and ``MAX_THREADS``."""
    return max(1, min(MAX_THREADS, os.cpu_count() or 1, num_bytes // BYTES_PER_THREAD))


def prefault(buffer: torch.Tensor) -> int:
    """Faults in every page of the contiguous CPU ``buffer`` (any dtype) for writing; returns the threads used."""
    flat = buffer.reshape(-1).view(torch.uint8)  # [num_bytes]
    num_bytes = flat.numel()
    if num_bytes == 0:
        return 0
    threads = num_threads(num_bytes)
    step = -(-num_bytes // (threads * PAGE)) * PAGE  # whole pages per thread
    slices = [(start, min(start + step, num_bytes)) for start in range(0, num_bytes, step)]
    if len(slices) == 1:
        _populate(flat, *slices[0])
    else:
        with ThreadPoolExecutor(len(slices), thread_name_prefix="prefault") as pool:
            list(pool.map(lambda bound: _populate(flat, *bound), slices))  # ctypes and torch release the GIL
    return len(slices)


def _populate(flat: torch.Tensor, start: int, stop: int) -> None:
    pointer = flat.data_ptr() + start
    aligned = pointer - pointer % PAGE  # madvise wants a page-aligned start; the page is ours to fault
    if _madvise(aligned, stop - start + (pointer - aligned)):
        return
    touched = flat[start:stop:PAGE]  # one byte per page
    touched.copy_(touched.clone())  # written with its own value: faulted for write, contents unchanged


def _madvise(pointer: int, length: int) -> bool:
    libc = _libc()
    if libc is None:
        return False
    return libc.madvise(ctypes.c_void_p(pointer), ctypes.c_size_t(length), _MADV_POPULATE_WRITE) == 0


def _libc():
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL(None, use_errno=True)
            _LIBC.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            _LIBC.madvise.restype = ctypes.c_int
        except (OSError, AttributeError):
            _LIBC = False
    return _LIBC or None


_LIBC = None
