"""Memory and throughput readings for the UI and the planner's budgets.

GPU figures come from NVML (package ``nvidia-ml-py``) because it sees the whole
device, not just this process's torch allocator; everything else comes from psutil.
A missing GPU or driver is normal (CPU-only machines) and never an error here.
"""

from __future__ import annotations


import functools
import logging
import weakref
from dataclasses import dataclass

import psutil
import torch
from byte_units import format_bytes  # noqa: F401 (engine.format_bytes: the app's and the reader's, torch-free)

from ..kv import route
from .gpu_ids import indexed, nvml_handle

logger = logging.getLogger(__name__)

HOST_BUDGET_FRACTION = 0.85  # leave room for the OS, the UI and page cache


@dataclass(frozen=True)
class MemorySnapshot:
    """One reading of device and host memory, in bytes (GPU fields ``None`` without NVML)."""

    gpu_used: int | None
    gpu_total: int | None
    gpu_name: str | None
    process_rss: int
    system_used: int
    system_total: int
    system_available: int


@functools.lru_cache(maxsize=1)
def _nvml():
    """Initialises NVML once; returns the module, or None when no driver/GPU is usable."""
    try:
        import pynvml  # optional dependency: NVML (nvidia-ml-py) where a driver is

        pynvml.nvmlInit()
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver errors...
        logger.debug("NVML unavailable, GPU memory readings disabled: %s", exc)
        return None
    logger.debug("NVML initialised")
    return pynvml


def _read_gpu(gpu_index: int) -> tuple[int | None, int | None, str | None]:
    nvml = _nvml()
    if nvml is None:
        return None, None, None
    try:
        handle = nvml_handle(nvml, gpu_index)  # the CUDA ordinal's card, found by PCI bus id
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
        name = nvml.nvmlDeviceGetName(handle)
    except Exception as exc:  # bad index or a GPU that fell off the bus must not break the UI
        logger.debug("NVML reading for GPU %d failed: %s", gpu_index, exc)
        return None, None, None
    if isinstance(name, bytes):  # older bindings return bytes
        name = name.decode(errors="replace")
    return int(info.used), int(info.total), str(name)


def read_memory(gpu_index: int = 0) -> MemorySnapshot:
    """Reads GPU (via NVML, when present) and host memory; never raises for a missing GPU.

    ``gpu_index``: the CUDA ordinal (``cuda:N``), not NVML's index."""
    gpu_used, gpu_total, gpu_name = _read_gpu(gpu_index)
    vm = psutil.virtual_memory()
    return MemorySnapshot(
        gpu_used=gpu_used,
        gpu_total=gpu_total,
        gpu_name=gpu_name,
        process_rss=int(psutil.Process().memory_info().rss),
        system_used=int(vm.used),
        system_total=int(vm.total),
        system_available=int(vm.available),
    )


def synchronize(device) -> None:
    """Waits for the device's queued work (a no-op on the CPU, whose work has run when a call returns)."""
    if getattr(device, "type", device) == "cuda":
        torch.cuda.synchronize(indexed(device))


_ACTIVATION_PEAKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {chunk: bytes}


def measure_activation_peak(model, chunk: int, vocab_size: int, cuda=None) -> int | None:
    """The activation peak of one chunk on this GPU (bytes above what was allocated before), from one dry-run
    forward of ``chunk`` tokens; measured once per (model, chunk). None off CUDA (the plan keeps its estimate).

    ``cuda``: torch.cuda, or a stand-in with its memory counters (tests)."""

    device = next(model.parameters()).device
    if cuda is None:
        if device.type != "cuda":
            return None
        cuda = torch.cuda
    peaks = _ACTIVATION_PEAKS.setdefault(model, {})
    if chunk not in peaks:
        ids = torch.randint(0, vocab_size, (1, chunk), device=device)
        cuda.synchronize(device)
        before = cuda.memory_allocated(device)
        cuda.reset_peak_memory_stats(device)
        no_forward_in_flight()
        with torch.inference_mode():
            model(ids, use_cache=False, logits_to_keep=1)  # a first chunk: attention over the chunk itself
        cuda.synchronize(device)
        peaks[chunk] = max(0, cuda.max_memory_allocated(device) - before)
        logger.info("dry-run chunk of %d tokens: activation peak %.0f MiB", chunk, peaks[chunk] / 2**20)
    return peaks[chunk]


def no_forward_in_flight() -> None:
    """A dry run is a forward without a HeadInferCache: a KV route an earlier, failed forward left on this thread
    (an update whose attention never ran) must not be taken for its own (``kv/route.py``)."""

    route.clear()
