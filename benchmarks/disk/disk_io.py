"""Disk and page-cache measurements for the snapshot benchmark: cold reads, fsynced writes, residency checks.

A cold read drops the file from the page cache with ``posix_fadvise(DONTNEED)`` (clean pages only, so
after an fsync) and checks with ``mincore(2)`` that nothing is left resident.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from pathlib import Path

import torch

PIECE_BYTES = 64 << 20


# -- page cache --------------------------------------------------------------------------------
def drop_from_page_cache(path: Path) -> float:
    """Asks the kernel to drop ``path``'s clean pages; returns the fraction still cached (mincore)."""
    with open(path, "rb") as file:
        os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return cached_fraction(path)


def cached_fraction(path: Path) -> float:
    """Fraction of ``path``'s pages in the page cache, from mincore(2) on a read-only mapping."""
    size = path.stat().st_size
    if size == 0:
        return 0.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vector = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as file:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, file.fileno(), 0)
        if address in (None, ctypes.c_void_p(-1).value):
            return float("nan")
        try:
            if libc.mincore(ctypes.c_void_p(address), size, vector) != 0:
                return float("nan")
        finally:
            libc.munmap(ctypes.c_void_p(address), size)
    return sum(b & 1 for b in bytes(vector)) / pages  # the low bit: resident; the others are reserved


def drop_folder(folder: Path) -> float:
    """Drops every file of ``folder`` from the page cache; returns the largest fraction still cached."""
    return max(drop_from_page_cache(path) for path in folder.iterdir() if path.is_file())


# -- the disk -------------------------------------------------------------------------------
def write_probe(path: Path, num_bytes: int) -> dict:
    """Writes ``num_bytes`` of random data with fsync; returns the write bandwidth."""
    view = memoryview(torch.randint(0, 256, (PIECE_BYTES,), dtype=torch.uint8).numpy())
    started = time.perf_counter()
    with open(path, "wb", buffering=0) as file:
        for _ in range(num_bytes // PIECE_BYTES):
            file.write(view)
        os.fsync(file.fileno())
    return {"bytes": num_bytes, "write_gbps": num_bytes / (time.perf_counter() - started) / 1e9}


def read_gbps(paths: list[Path], *, cold: bool) -> tuple[float, float]:
    """Sequential read bandwidth of ``paths`` (16 MiB reads into one buffer) and the fraction that was cached."""
    cached = max(drop_from_page_cache(p) for p in paths) if cold else 1.0
    buffer = memoryview(bytearray(16 << 20))
    started, total = time.perf_counter(), 0
    for path in paths:
        with open(path, "rb", buffering=0) as file:
            os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            while read := file.readinto(buffer):
                total += read
    return total / (time.perf_counter() - started) / 1e9, cached


def cpu_pressure() -> float:
    """Share of the last 10 s in which runnable tasks waited for a CPU (Linux PSI); other jobs' load."""
    try:
        return float(Path("/proc/pressure/cpu").read_text().split()[1].split("=")[1])
    except (OSError, IndexError, ValueError):
        return float("nan")
