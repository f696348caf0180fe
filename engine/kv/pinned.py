"""Host memory for the offloaded homes: page-locked at exactly its size, unlocked only when no copy can touch it.

torch's pinned allocator rounds every block up to a power of two, which can double the host RAM a large KV
home takes; registering ordinary memory with ``cudaHostRegister`` locks exactly what is used. Two rules:

- A refused registration is a planning error, never a silent fallback to the rounding allocator (which
  would ask for up to twice the memory that was just refused). With a pin *limit* (``pin_budget.py``) homes past
  it, or past a refusal, stay pageable instead, and the staging ring (``staging_ring.py``) fetches them. The CUDA runtime records the failure as
  its "last error", which the next unrelated kernel launch would report as its own; it is cleared here, in
  the libcudart torch itself uses (a process may map several).
- Memory is unregistered and freed only after ``fence()`` has returned: the owner's copy streams are
  idle, so no asynchronous copy into or out of it can still be in flight.

Pages are faulted in before they are registered (``prefault.py``, on a few threads), never by the registration.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import mmap
import os
import weakref
from collections.abc import Callable

import torch

from ..errors import PinningError
from .ledger import HOMES, Ledger
from .prefault import prefault

logger = logging.getLogger(__name__)

_HOST_REGISTER_PORTABLE = 1
_PAGE = mmap.PAGESIZE


class CudaRuntime:
    """The CUDA runtime calls host registration needs; every result is an error code, never raised."""

    def __init__(self):
        self._torch = torch.cuda.cudart()
        self._lib = _loaded_cudart()

    def host_register(self, pointer: int, num_bytes: int) -> int:
        # Portable: the pages are page-locked for every CUDA context, whichever device is current now.
        return int(self._torch.cudaHostRegister(pointer, num_bytes, _HOST_REGISTER_PORTABLE))

    def host_unregister(self, pointer: int) -> int:
        return int(self._torch.cudaHostUnregister(pointer))

    def error_string(self, code: int) -> str:
        if self._lib is not None:
            self._lib.cudaGetErrorString.restype = ctypes.c_char_p
            return self._lib.cudaGetErrorString(code).decode(errors="replace")
        try:  # torch's binding takes its own enum, not an int
            return str(self._torch.cudaGetErrorString(self._torch.cudaError(code)))
        except (TypeError, ValueError, RuntimeError):
            return f"cudaError {code}"

    def clear_last_error(self) -> None:
        """Resets the runtime's per-thread last error, so the next launch does not report this failure."""
        if self._lib is not None:
            self._lib.cudaGetLastError()
            return
        # No handle on libcudart: a launch whose check reads (and so clears) the stale error raises once.
        try:
            torch.zeros(1, device="cuda").add_(1)
        except RuntimeError:
            pass


@functools.cache
def cuda_runtime() -> CudaRuntime:
    return CudaRuntime()


def _loaded_cudart(torch_library: str | None = None) -> ctypes.CDLL | None:
    """A handle on the libcudart whose state torch's CUDA calls use (its per-thread "last error" is the one to clear).

    Not the first libcudart in ``/proc/self/maps``: a process can map several (a system CUDA, another package's
    wheel), and clearing another copy's last error leaves torch's set. torch's libraries bind cudart symbols the
    way the dynamic linker does: the global scope first, then the dependencies of the library that loaded them
    (``torch._C``, or ``torch_library``); the handle is the first of those through which the runtime resolves.
    """
    for path in (None, torch_library or getattr(torch._C, "__file__", None)):
        try:
            # dlopen(NULL) searches the global scope; RTLD_NOLOAD only finds an already-loaded library's handle.
            handle = ctypes.CDLL(None) if path is None else ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
            handle.cudaGetLastError  # noqa: B018 (raises AttributeError where the runtime is not in this scope)
        except (OSError, AttributeError):
            continue
        return handle
    return None


class HostMemory:
    """Allocates host tensors for homes; page-locks them when ``pin`` is set.

    ``fence`` must return only once no asynchronous copy can touch host memory (the copy streams are idle).
    """

    def __init__(self, pin: bool, fence: Callable[[], None], runtime: CudaRuntime | None = None,
                 ledger: Ledger | None = None, budget=None):
        self.pin = pin
        self.ledger = ledger if ledger is not None else Ledger()  # every home's bytes are recorded there
        # The streams' ``pin_budget.PinBudget``: with a limit, homes past it stay pageable (the staging ring
        # fetches them); on emulated streams (``pin`` False) plain memory within it stands for pinned memory.
        self.budget = budget
        self._fence = fence
        self._runtime = runtime if runtime is not None or not pin else cuda_runtime()
        self._registered: dict[int, torch.Tensor] = {}  # data_ptr -> the tensor that owns the memory
        # Dropping the owner without free_all() still fences before unlocking (the finalizer holds no self).
        self._finalizer = weakref.finalize(self, _release, self._registered, fence, self._runtime)

    @property
    def num_registered(self) -> int:
        return len(self._registered)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        # Created outside inference mode: homes are written in place by restores and by generate() (no_grad)
        # even when the first forward, which allocates them, ran under inference mode.
        num_bytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        budget = self.budget
        limited = budget is not None and budget.is_limited
        slack = _PAGE if self.pin else 0  # what is locked is rounded up to whole pages
        if num_bytes == 0 or (limited and not budget.fits(num_bytes + slack, reserve=True)):
            return self.ledger.empty(HOMES, shape, dtype, "cpu")  # past the pin budget: pageable, staged
        if not self.pin:
            tensor = self.ledger.empty(HOMES, shape, dtype, "cpu")
            return budget.take(tensor) if limited else tensor
        self.ledger.check(HOMES, num_bytes, "cpu")
        with torch.inference_mode(False):
            # Whole pages of its own: the driver tracks registrations by page, so two homes sharing a page
            # (small heap allocations sit side by side) would make the second registration fail.
            rounded = -(-num_bytes // _PAGE) * _PAGE
            base = torch.empty(rounded + _PAGE, dtype=torch.uint8)
            offset = -base.data_ptr() % _PAGE
            tensor = base[offset : offset + num_bytes].view(dtype).view(shape)
            # Faulted in on a few threads first: cudaHostRegister would fault every page on this one.
            prefault(base[offset : offset + rounded])
        code = self._runtime.host_register(base.data_ptr() + offset, rounded)
        if code != 0:
            self._runtime.clear_last_error()
            if limited:  # the staging ring fetches pageable homes: the driver's cap lowers the budget
                budget.refuse()
                return self.ledger.record(HOMES, tensor)
            raise PinningError(
                f"could not page-lock {num_bytes / 2**30:.2f} GiB of host memory for the KV cache "
                f"({self._runtime.error_string(code)}); lower the host memory budget (--host-memory) or the "
                "context, or close other programs")
        if budget is not None:
            try:
                budget.take(tensor, rounded)
            except PinningError:  # another cache (tab) or the ring took the room meanwhile: stays pageable
                _unregister(self._runtime, tensor)
                return self.ledger.record(HOMES, tensor)
        self._registered[tensor.data_ptr()] = tensor
        return self.ledger.record(HOMES, tensor)

    def free(self, tensor: torch.Tensor) -> None:
        """Unlocks and drops ``tensor`` once no copy can touch it; the caller holds no other reference."""
        owner = self._registered.pop(tensor.data_ptr(), None)
        if owner is None:
            return
        self._fence()
        _unregister(self._runtime, owner)
        if self.budget is not None:
            self.budget.give_back(owner)

    def free_all(self) -> None:
        self._finalizer()


def _unregister(runtime: CudaRuntime, tensor: torch.Tensor) -> None:
    code = runtime.host_unregister(tensor.data_ptr())
    if code != 0:
        runtime.clear_last_error()
        logger.warning("cudaHostUnregister failed: %s", runtime.error_string(code))


def _release(registered: dict[int, torch.Tensor], fence: Callable[[], None], runtime: CudaRuntime | None) -> None:
    if not registered:
        return
    fence()
    for tensor in registered.values():
        _unregister(runtime, tensor)
    registered.clear()
