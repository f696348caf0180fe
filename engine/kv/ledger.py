"""The allocation ledger: every buffer the KV core allocates goes through one point that records its bytes.

Each cache owns one ``Ledger``. Buffers are made with ``ledger.empty(category, shape, dtype, device)`` or, where
another allocator makes them (page-locked homes, disk-tier files), recorded with ``ledger.record(category, t)``.
The ledger counts the bytes each (category, device) holds now and the most it has held at once (``peak``), so a
test can hold what the engine allocated against what the plan (``Plan.allocations``) promised, category by
category, on a CPU.

A buffer counts as held until the tensor object handed out is collected (a finalizer), so an old and a new copy
alive together during a growth both count, as they do in the device's memory.

``inject`` makes the next allocations of a category fail with ``AllocationRefused`` (a ``torch.OutOfMemoryError``),
exactly where a real allocator would refuse: the way tests prove that running out of memory anyway leaves the
document and the conversation intact.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import Counter
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)

# What the plan and the ledger both count (``Plan.allocations`` uses the same names).
HOMES = "homes"  # the KV homes: resident ones on the compute device, offloaded ones in RAM or on disk
STAGING = "staging"  # the two buffers a chunk's K/V is written to in home layout
PINGPONG = "pingpong"  # the two buffers offloaded groups are fetched into
CODES = "codes"  # 8-bit code and scale planes beside the staging and ping-pong buffers
HOST_IO = "host_io"  # page-locked landing (queries) and output buffers of host attention
DISK_STREAM = "disk_stream"  # the disk tier's pinned pieces and write buffers
SOURCES = "sources"  # the sources pass: the keys of the retrieval heads and their attention mass
SCRATCH = "scratch"  # contiguous K/V that SDPA's fused kernels read, one buffer the kernels write views of
CATEGORIES = (HOMES, STAGING, PINGPONG, CODES, HOST_IO, DISK_STREAM, SOURCES, SCRATCH)

DISK = "disk"  # the device name of a disk-tier home (a file mapping: no RAM is committed for it)


class AllocationRefused(torch.OutOfMemoryError):
    """An allocation the ledger was told to refuse (``inject``): a stand-in for a real out-of-memory error."""

    def __init__(self, category: str, num_bytes: int, device: str):
        super().__init__(f"out of memory: {num_bytes / 2**20:.1f} MiB for {category} on {device} (injected)")
        self.category, self.num_bytes, self.device = category, num_bytes, device


class Ledger:
    """Bytes by (category, device): held now and the peak; thread-safe (the disk worker allocates too)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._held: Counter = Counter()
        self._peak: Counter = Counter()
        self._peak_total = 0
        self._refuse: list[tuple[Callable[[str, int, str], bool], list[int]]] = []

    # -- the allocation point ---------------------------------------------------------------------
    def empty(self, category: str, shape, dtype: torch.dtype, device, *, pin: bool = False) -> torch.Tensor:
        """``torch.empty`` of ``shape`` recorded under ``category`` (created outside inference mode: buffers are
        written in place later, also by generate() under no_grad)."""
        device = torch.device(device)
        num_bytes = torch.Size(shape).numel() * _element_size(dtype)
        self.check(category, num_bytes, _name(device))
        with torch.inference_mode(False):
            tensor = torch.empty(shape, dtype=dtype, device=device, pin_memory=pin)
        return self.record(category, tensor)

    def check(self, category: str, num_bytes: int, device: str) -> None:
        """Raises ``AllocationRefused`` where ``inject`` asked for it; call before allocating elsewhere."""
        with self._lock:
            for matches, remaining in self._refuse:
                if remaining[0] > 0 and matches(category, num_bytes, device):
                    remaining[0] -= 1
                    raise AllocationRefused(category, num_bytes, device)

    def record(self, category: str, tensor: torch.Tensor, device: str | None = None) -> torch.Tensor:
        """Counts ``tensor`` (made elsewhere) under ``category`` until it is collected; returns it."""
        assert category in CATEGORIES, category
        key = (category, device or _name(tensor.device))
        num_bytes = tensor.nbytes
        with self._lock:
            self._held[key] += num_bytes
            self._peak[key] = max(self._peak[key], self._held[key])
            self._peak_total = max(self._peak_total, sum(self._held.values()))
        weakref.finalize(tensor, self._release, key, num_bytes)
        return tensor

    def _release(self, key: tuple[str, str], num_bytes: int) -> None:
        with self._lock:
            self._held[key] -= num_bytes

    # -- fault injection (tests) ------------------------------------------------------------------
    def inject(self, category: str | None = None, *, count: int = 1, min_bytes: int = 0) -> None:
        """Refuses the next ``count`` allocations of ``category`` (any, when None) of at least ``min_bytes``."""
        self._refuse.append((lambda c, n, d: (category is None or c == category) and n >= min_bytes, [count]))

    def clear_injections(self) -> None:
        self._refuse.clear()

    # -- reading ----------------------------------------------------------------------------------
    def held(self, category: str | None = None, device: str | None = None) -> int:
        with self._lock:
            return sum(n for (c, d), n in self._held.items() if category in (None, c) and device in (None, d))

    def peak(self, category: str | None = None, device: str | None = None) -> int:
        """The most a category held at once (summed over devices unless one is named); all: the peak total."""
        with self._lock:
            if category is None and device is None:
                return self._peak_total
            return sum(n for (c, d), n in self._peak.items() if category in (None, c) and device in (None, d))

    def table(self) -> dict[str, int]:
        """category -> peak bytes (every category, zeros included)."""
        return {category: self.peak(category) for category in CATEGORIES}


def _name(device: torch.device) -> str:
    return torch.device(device).type


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
