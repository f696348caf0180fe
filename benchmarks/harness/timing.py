"""Timing (warm-up, device events or a synchronize before reading a clock, median of N) and per-phase peaks."""

from __future__ import annotations

import gc
import logging
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from engine.planning.budgets import CUDA_CONTEXT_BYTES
from engine.planning.gpu_ids import indexed, nvml_handle

logger = logging.getLogger(__name__)


def summed(seconds: dict, name: str, function: Callable, calls: dict | None = None) -> Callable:
    """``function`` wrapped to add each call's wall seconds to ``seconds[name]`` (and 1 to ``calls[name]``): how a
    study times the parts of a forward, by wrapping the module functions that run them (in a process of its own)."""
    def wrapper(*args, **kwargs):
        begin = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds[name] += time.perf_counter() - begin
            if calls is not None:
                calls[name] += 1
    return wrapper


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(indexed(device))


def time_once(fn: Callable[[], object], device: torch.device | str) -> float:
    """Seconds one call of ``fn`` takes on ``device``: CUDA events on GPU, perf_counter after a sync on CPU."""
    device = torch.device(device)
    synchronize(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    begin = time.perf_counter()
    fn()
    return time.perf_counter() - begin


def median_seconds(fn: Callable[[], object], device: torch.device | str, *, warmup: int = 1, repeats: int = 3,
                   max_seconds: float | None = None) -> tuple[float, list[float]]:
    """(median, samples) of ``repeats`` timed calls after ``warmup`` untimed ones.

    With ``max_seconds``, stops repeating once the timed calls have used that much (at least one sample).
    """
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    for _ in range(max(1, repeats)):
        samples.append(time_once(fn, device))
        if max_seconds is not None and sum(samples) >= max_seconds:
            break
    return statistics.median(samples), samples


@dataclass
class PhasePeaks:
    """Peak memory of one phase (bytes; GPU figures None on CPU)."""

    allocated: int | None = None
    reserved: int | None = None
    nvml_used: int | None = None
    host_pinned: int | None = None
    extra: dict = field(default_factory=dict)

    def as_dict(self, prefix: str) -> dict:
        values = {"allocated": self.allocated, "reserved": self.reserved, "nvml_used": self.nvml_used,
                  "host_pinned": self.host_pinned}
        return {f"{prefix}_{k}": v for k, v in values.items() if v is not None}


@contextmanager
def track_peaks(device: torch.device | str):
    """Yields a ``PhasePeaks`` filled in when the block ends: allocator peaks since it began, NVML now."""
    device = indexed(device)  # torch 2.11 refuses a bare "cuda" in some memory APIs
    peaks = PhasePeaks()
    is_cuda = device.type == "cuda"
    if is_cuda:
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    try:
        yield peaks
    finally:
        if is_cuda:
            synchronize(device)
            peaks.allocated = torch.cuda.max_memory_allocated(device)
            peaks.reserved = torch.cuda.max_memory_reserved(device)
            peaks.nvml_used = nvml_process_used(device)
            peaks.host_pinned = pinned_host_bytes()


def nvml_process_used(device: torch.device) -> int | None:
    """GPU memory NVML attributes to this process (falls back to the whole device's use in containers)."""
    try:
        import pynvml  # optional dependency: NVML (nvidia-ml-py) where a driver is

        pynvml.nvmlInit()
        handle = nvml_handle(pynvml, device)  # by PCI bus id: CUDA_VISIBLE_DEVICES may reorder the cards
        for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if process.pid == os.getpid() and process.usedGpuMemory:
                return int(process.usedGpuMemory)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception as exc:  # no NVML: the allocator figures still stand
        logger.debug("NVML reading failed: %s", exc)
        return None


def cuda_context_bytes(device: torch.device | str) -> int:
    """What this process's CUDA context takes on its card: the card's used bytes less what the allocator reserved,
    read before the model is built on a card the benchmark has to itself (784e6 bytes on the H200). Falls back to
    the planner's ``CUDA_CONTEXT_BYTES`` where the reading is implausible (another process on the card)."""
    card = indexed(device)
    free, total = torch.cuda.mem_get_info(card)
    used = total - free - torch.cuda.memory_reserved(card)
    if not 0 < used < 4 << 30:
        logger.warning("CUDA context reading %.2f GiB is implausible: assuming %.2f GiB", used / 2**30,
                       CUDA_CONTEXT_BYTES / 2**30)
        return CUDA_CONTEXT_BYTES
    return used


def pinned_host_bytes() -> int | None:
    """Bytes the pinned host allocator holds (power-of-two rounded blocks), or None where torch cannot say."""
    try:
        stats = torch.cuda.host_memory_stats()
    except Exception:  # older torch, or a CPU build
        return None
    value = stats.get("allocated_bytes.current") or stats.get("reserved_bytes.current")
    return int(value) if value is not None else None


@contextmanager
def quick_collections() -> Iterator[None]:
    """While a benchmark runs: the objects alive when it starts (imported modules, a test process's fixtures) are
    left out of garbage collection (``gc.freeze``), so ``release_memory``'s collection between probes walks only what
    the probes made: a full collection of a process with torch and transformers imported took 0.2 s, 43 of them most
    of a tiny sweep's time. They are handed back to the collector afterwards (``gc.unfreeze``): nothing leaks."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def release_memory(device: torch.device | str) -> None:
    """Frees what the last probe left: Python garbage, cached device blocks, cached pinned host blocks."""
    gc.collect()
    if torch.device(device).type == "cuda":
        synchronize(device)
        torch.cuda.empty_cache()  # every device's cache (the API takes none)
        empty_host = getattr(torch._C, "_host_emptyCache", None)
        if empty_host is not None:
            empty_host()  # pinned blocks stay cached otherwise, and the next probe's host budget shrinks
