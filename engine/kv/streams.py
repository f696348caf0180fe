"""The streams seam: every stream, event, asynchronous copy, pinned allocation and "current stream" of the KV core.

The engine orders KV movement with CUDA streams and events (``transfer.py``, ``disk_stream.py``). On a CPU every
copy is synchronous, so a missing or misplaced wait would be invisible there. So the engine never calls
``torch.cuda`` for these: it calls a backend, and the same code runs on three:
- ``cuda``: torch's streams and events (``cuda-lagged``: the same, with ``torch.cuda._sleep`` injected before
  side-stream copies and compute-stream waits, so a missing wait shows up as a wrong answer on a real GPU);
- ``sync``: a CPU-only machine's behaviour: streams run each operation at once on the calling thread, events
  are always complete;
- ``emulated`` (``emulated.py``): side streams are FIFO worker threads that run copies after random delays, with
  a happens-before checker (``happens_before.py``) over every declared access — the CUDA ordering proved on a
  CPU. Chosen with ``OffloadPolicy(streams="emulated")`` or the environment variable ``HEADINFER_STREAMS``
  (``HEADINFER_STREAMS_SEED`` seeds the delays).

Each backend offers: ``new_stream(name)``, ``event(blocking)``, ``current()``, ``use(stream)``,
``copy(dst, src)`` and ``copy_many(dsts, srcs)`` (on the current stream), ``pinned(shape, dtype)`` (charged to
``pin_budget``: a ``pin_budget.PinBudget``, None where nothing is pinned), the access
declarations ``read(t, what)`` / ``write(t, what)`` (by the current stream) and ``host_read`` / ``host_write`` (by
this host thread), and the joins of worker threads ``submit(executor, fn, *args)`` / ``joined(future)``. Streams
have ``wait_event``, ``synchronize``; events have ``record(stream)``, ``synchronize()``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import Executor, Future

import torch

from ..errors import InputError
from .emulated import EmulatedStreams
from .pin_budget import process_budget

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "cuda", "sync", "emulated", "cuda-lagged")
ENV_BACKEND = "HEADINFER_STREAMS"
ENV_SEED = "HEADINFER_STREAMS_SEED"


def resolve(choice: str, device: torch.device) -> str:
    """The backend a cache on ``device`` uses: the environment variable overrides ``"auto"``."""
    if choice == "auto":
        choice = os.environ.get(ENV_BACKEND, "").strip().lower() or "auto"
    if choice not in BACKENDS:
        raise InputError(f"{ENV_BACKEND} / streams must be one of {', '.join(BACKENDS)}, got {choice!r}")
    if choice == "auto":
        return "cuda" if device.type == "cuda" else "sync"
    if choice in ("cuda", "cuda-lagged") and device.type != "cuda":
        raise InputError(f"streams={choice!r} needs a CUDA device, the cache computes on {device}")
    if choice == "emulated" and device.type != "cpu":
        raise InputError("emulated streams run on the CPU: use device='cpu' (they prove the CUDA ordering there)")
    return choice


def make(choice: str, device: torch.device, seed: int | None = None):
    """A new backend for one cache (each has its own side streams)."""
    name = resolve(choice, device)
    if name == "sync":
        return SyncStreams()
    if name == "emulated":
        if seed is None:
            seed = int(os.environ.get(ENV_SEED, "0") or 0)
        return EmulatedStreams(seed=seed)
    return CudaStreams(device, lagged=name == "cuda-lagged")


# -- synchronous: a CPU-only machine --------------------------------------------------------------------
class _SyncStream:
    def __init__(self, name: str):
        self.name = name

    def wait_event(self, event) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _SyncEvent:
    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass


class SyncStreams:
    """Every operation runs at once on the calling thread: nothing is ever in flight."""

    name = "sync"
    is_async = False
    pin_budget = None  # nothing is page-locked (``pin_budget.py``)

    def __init__(self):
        self._compute = _SyncStream("compute")

    def new_stream(self, name: str) -> _SyncStream:
        return _SyncStream(name)

    def event(self, blocking: bool = False) -> _SyncEvent:
        return _SyncEvent()

    def current(self) -> _SyncStream:
        return self._compute

    def use(self, stream):
        return contextlib.nullcontext()

    def copy(self, dst: torch.Tensor, src: torch.Tensor, what: str = "") -> None:
        dst.copy_(src)

    def copy_many(self, dsts: list[torch.Tensor], srcs: list[torch.Tensor], what: str = "") -> None:
        """``copy`` of each pair, issued as one call (one dispatch: a layer's append, a run's fetch)."""
        torch._foreach_copy_(dsts, srcs)

    def pinned(self, shape, dtype: torch.dtype) -> torch.Tensor:
        with torch.inference_mode(False):
            return torch.empty(shape, dtype=dtype)

    def read(self, tensor: torch.Tensor, what: str = "") -> None:
        pass

    write = host_read = host_write = read

    def forget(self, tensor: torch.Tensor) -> None:
        pass

    def submit(self, executor: Executor, fn: Callable, *args) -> Future:
        return executor.submit(fn, *args)

    def joined(self, future: Future) -> None:
        pass

    def close(self) -> None:
        pass


# -- CUDA --------------------------------------------------------------------------------------------
class CudaStreams(SyncStreams):
    """torch's CUDA streams and events; ``lagged`` injects GPU sleeps where a missing wait would then show."""

    name = "cuda"
    is_async = True
    _LAG_CYCLES = 2_000_000  # ~1 ms at 2 GHz: long next to a KV copy of a small model

    def __init__(self, device: torch.device, lagged: bool = False):
        self.device = device
        self.lagged = lagged
        self.pin_budget = process_budget()  # pins are counted per process (``HEADINFER_PIN_LIMIT`` caps them)
        if lagged:
            self.name = "cuda-lagged"

    def new_stream(self, name: str) -> torch.cuda.Stream:
        return _LaggedStream(self.device, self._LAG_CYCLES) if self.lagged else torch.cuda.Stream(self.device)

    def event(self, blocking: bool = False) -> torch.cuda.Event:
        # Blocking: a host thread waiting for it sleeps instead of spinning a core host attention needs.
        return torch.cuda.Event(blocking=blocking)

    def current(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def use(self, stream):
        return torch.cuda.stream(stream)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, what: str = "") -> None:
        if self.lagged and torch.cuda.current_stream(self.device) != torch.cuda.default_stream(self.device):
            torch.cuda._sleep(self._LAG_CYCLES // 4)  # the copy runs late: a reader that did not wait sees it
        # Asynchronous from and to page-locked memory; from pageable memory CUDA stages it (still correct).
        dst.copy_(src, non_blocking=True)

    def copy_many(self, dsts: list[torch.Tensor], srcs: list[torch.Tensor], what: str = "") -> None:
        if self.lagged and torch.cuda.current_stream(self.device) != torch.cuda.default_stream(self.device):
            torch.cuda._sleep(self._LAG_CYCLES // 4)
        # Between host and device torch takes each pair through copy_(non_blocking=True) in C++ (its foreach
        # fast path is for same-device tensors): the same asynchronous copies as ``copy``, one Python call.
        torch._foreach_copy_(dsts, srcs, non_blocking=True)

    def pinned(self, shape, dtype: torch.dtype) -> torch.Tensor:
        num_bytes = torch.Size(shape).numel() * dtype.itemsize
        self.pin_budget.check(num_bytes)  # never asks the driver past the budget
        with torch.inference_mode(False):  # written in place later, also outside inference mode
            return self.pin_budget.take(torch.empty(shape, dtype=dtype, pin_memory=True), num_bytes)

    def read(self, tensor: torch.Tensor, what: str = "") -> None:
        if self.lagged:  # the compute stream touches it late: a copy that did not wait for it overtakes it
            torch.cuda._sleep(self._LAG_CYCLES // 4)

    write = read


class _LaggedStream(torch.cuda.Stream):
    """A side stream whose waits run late (the compute stream's lag is injected where it waits)."""

    def __new__(cls, device, cycles):
        self = super().__new__(cls, device)
        self._cycles = cycles
        return self

    def wait_event(self, event) -> None:
        super().wait_event(event)
        with torch.cuda.stream(self):
            torch.cuda._sleep(self._cycles // 4)
