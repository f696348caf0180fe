"""A strict stand-in for the ``torch.cuda`` calls the benchmark harness makes, for CPU CI.

Every call that names a device refuses one without an index, as torch 2.11's ``set_per_process_memory_fraction``
does (the first GPU run lost every decode/prefill/peak/max-context step to it): a harness that passes a bare
``torch.device("cuda")`` anywhere fails here, on the CPU. Tensors meant for ``cuda`` are made on the CPU
(``CudaOnCpu``), so the real harness and engine run underneath; the counters are plausible, not measured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

GIB = 1 << 30
CONTEXT_BYTES = 784_000_000  # the H200's CUDA context (torch 2.11, CUDA 13.0)


def _index(device, *, optional: bool = True) -> int:
    """torch 2.11's rule, applied to every call: an int, or a CUDA device with an index (None: current)."""
    if device is None and optional:
        return 0
    if isinstance(device, int):
        return device
    if isinstance(device, str | torch.device):
        device = torch.device(device)
        if device.type == "cuda" and device.index is not None:
            return device.index
    raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")


@dataclass
class _Properties:
    name: str = "Strict Fake GPU"
    total_memory: int = 80 * GIB
    pci_domain_id: int = 0
    pci_bus_id: int = 0x3B
    pci_device_id: int = 0


class _Event:
    def __init__(self, enable_timing: bool = False):
        self.at = None

    def record(self, stream=None):
        self.at = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end: _Event) -> float:
        return (end.at - self.at) * 1e3


class StrictCuda:
    """Records every call (``calls``: (name, index)); the counters are the CPU process's, scaled to look real."""

    def __init__(self, properties: list[_Properties] | None = None):
        self.properties = properties or [_Properties()]
        self.calls: list[tuple[str, int | None]] = []
        self.fraction: dict[int, float] = {}

    def _seen(self, name: str, device, optional: bool = True) -> int:
        index = _index(device, optional=optional)
        self.calls.append((name, index))
        return index

    # the API ------------------------------------------------------------------------------------
    def is_available(self):
        return True

    def device_count(self):
        return len(self.properties)

    def current_device(self):
        return 0

    def get_device_properties(self, device=None):
        return self.properties[self._seen("get_device_properties", device)]

    def get_device_name(self, device=None):
        return self.get_device_properties(device).name

    def set_per_process_memory_fraction(self, fraction, device=None):
        if not isinstance(fraction, float):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        self.fraction[self._seen("set_per_process_memory_fraction", device, optional=False)] = fraction

    def synchronize(self, device=None):
        self._seen("synchronize", device)

    def reset_peak_memory_stats(self, device=None):
        self._seen("reset_peak_memory_stats", device)

    def max_memory_allocated(self, device=None):
        self._seen("max_memory_allocated", device)
        return 3 * GIB

    def max_memory_reserved(self, device=None):
        self._seen("max_memory_reserved", device)
        return 3 * GIB + 256 * (1 << 20)

    def memory_allocated(self, device=None):
        self._seen("memory_allocated", device)
        return 2 * GIB

    def memory_reserved(self, device=None):
        self._seen("memory_reserved", device)
        return 0  # read before the model is built: nothing reserved yet

    def mem_get_info(self, device=None):
        index = self._seen("mem_get_info", device)
        total = self.properties[index].total_memory
        return total - CONTEXT_BYTES, total

    def empty_cache(self):
        self.calls.append(("empty_cache", None))

    def host_memory_stats(self):
        return {"allocated_bytes.current": 0}

    Event = _Event

    def install(self, monkeypatch) -> StrictCuda:
        names = ("is_available", "device_count", "current_device", "get_device_properties", "get_device_name",
                 "set_per_process_memory_fraction", "synchronize", "reset_peak_memory_stats",
                 "max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved",
                 "mem_get_info", "empty_cache", "host_memory_stats", "Event")
        for name in names:
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        return self


def _is_cuda(value) -> bool:
    return isinstance(value, str | torch.device) and torch.device(value).type == "cuda"


class CudaOnCpu(TorchFunctionMode):
    """Tensors asked for on ``cuda`` are made on the CPU, unpinned (a CPU build has neither)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = torch.device("cpu")
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        if func in (torch.Tensor.cuda, torch.Tensor.pin_memory):
            return args[0]
        if func is torch.Tensor.to:
            args = tuple(torch.device("cpu") if _is_cuda(a) else a for a in args)
        return func(*args, **kwargs)


class FakeNvml:
    """``pynvml`` over cards in PCI order (``used``: bytes per card), found by bus id or by NVML index."""

    def __init__(self, buses: list[int], used: list[int]):
        self.by_bus = {f"00000000:{bus:02x}:00.0": i for i, bus in enumerate(buses)}
        self.used = used

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetHandleByPciBusId(self, bus_id):
        return self.by_bus[bus_id]

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return []

    def nvmlDeviceGetMemoryInfo(self, handle):
        return type("Info", (), {"used": self.used[handle], "total": 10 * self.used[handle]})()

    def nvmlDeviceGetName(self, handle):
        return "AB"[handle]
