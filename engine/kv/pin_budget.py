"""Pinned memory as a budget: how much host memory the engine may page-lock, and who holds it now.

Under Windows' display driver model (WDDM) and in WSL2 page-locked memory is capped far below the RAM
(docs/benchmarks/pin-budget.md), and under WDDM one refused ``cudaMallocHost`` makes every later one in the process
fail. So the engine never pins past a budget: homes are pinned while they fit it
(``pinned.HostMemory``), the rest stay in ordinary memory and are fetched through a small pinned staging ring
(``staging_ring.py``), and the ring's buffers are pinned first, before any home could meet the wall.

The budget's limit is ``HEADINFER_PIN_LIMIT`` (``64MiB``, ``4GiB``, bytes), else what ``probe_pinnable`` found
(the CUDA runtime, in steps, stopping at the first refusal and clearing it), else none (Linux: the plan's host
budget already bounds the homes, and the pinned path is the one it always took). Emulated streams give each cache
a budget of its own that refuses past the limit *stickily*, as WDDM does: the test of "never pin past it".
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import re
import sys
import threading
import weakref

import torch

from ..errors import InputError, PinningError

logger = logging.getLogger(__name__)

ENV_LIMIT = "HEADINFER_PIN_LIMIT"
#: Of the limit, what homes leave for the pins made later (host attention's buffers, grown buffers, disk pieces).
RESERVE_FRACTION = 0.125
#: The most the start-up probe pins (Windows, WSL2): past it the store is staged even if more could be pinned.
PROBE_CAP = 16 << 30
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
          "t": 1 << 40, "tib": 1 << 40, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_limit(text: str | None) -> int | None:
    """``"64MiB"`` / ``"4GiB"`` / ``"1.5g"`` / bytes -> bytes; empty or None -> None (no limit)."""
    if text is None or not text.strip():
        return None
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if match is None or match.group(2).lower() not in _UNITS:
        raise InputError(f"{ENV_LIMIT}={text!r} is not a size: write e.g. 64MiB, 4GiB or a number of bytes")
    size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size < 1:
        raise InputError(f"{ENV_LIMIT}={text!r} must be at least 1 byte")
    return size


def limit_from_env() -> int | None:
    return parse_limit(os.environ.get(ENV_LIMIT))


class PinBudget:
    """Bytes page-locked now against ``limit`` (None: unlimited), the storages that are, and (``sticky``) the
    emulated WDDM rule: after one refusal every later pin fails. Thread-safe (the staging ring's worker pins)."""

    def __init__(self, limit: int | None, *, sticky: bool = False):
        self.limit = limit
        self.sticky = sticky
        self.held = 0
        self.peak = 0
        self.refused = False  # a pin was refused (sticky budgets refuse every one after it)
        self.probed = False  # ``settle_limit`` has run (once per process)
        self._charges: dict[int, tuple[int, int]] = {}  # charge -> (storage data_ptr, bytes)
        self._storages: dict[int, int] = {}  # storage data_ptr -> charges on it
        self._next = 0
        self._lock = threading.Lock()

    @property
    def is_limited(self) -> bool:
        return self.limit is not None

    def room(self) -> int | None:
        """Bytes that may still be pinned (None: unlimited)."""
        return None if self.limit is None else max(0, self.limit - self.held)

    def fits(self, num_bytes: int, *, reserve: bool = False) -> bool:
        """Whether ``num_bytes`` more may be pinned; ``reserve``: leaving ``RESERVE_FRACTION`` of the limit free
        (what homes ask, so later small pins still fit)."""
        if self.limit is None:
            return not (self.sticky and self.refused)
        keep = int(self.limit * RESERVE_FRACTION) if reserve else 0
        return not (self.sticky and self.refused) and self.held + num_bytes <= self.limit - keep

    def check(self, num_bytes: int) -> None:
        """Raises ``PinningError`` where pinning ``num_bytes`` more would be refused (and marks the refusal)."""
        with self._lock:
            self._check(num_bytes)

    def take(self, tensor: torch.Tensor, num_bytes: int | None = None) -> torch.Tensor:
        """Charges ``tensor``'s storage (``num_bytes``: what was really locked) until it is collected or
        ``give_back``; raises ``PinningError`` past the limit (and, sticky, for every pin after a refusal)."""
        num_bytes = tensor.untyped_storage().nbytes() if num_bytes is None else num_bytes
        key = tensor.untyped_storage().data_ptr()
        with self._lock:
            self._check(num_bytes)
            self._next += 1
            charge = self._next
            self._charges[charge] = (key, num_bytes)
            self._storages[key] = self._storages.get(key, 0) + 1
            self.held += num_bytes
            self.peak = max(self.peak, self.held)
        weakref.finalize(tensor, self._release, charge)
        return tensor

    def _check(self, num_bytes: int) -> None:
        if (self.sticky and self.refused) or (self.limit is not None and self.held + num_bytes > self.limit):
            message = self._refusal(num_bytes)
            self.refused = True
            raise PinningError(message)

    def refuse(self) -> None:
        """The driver refused a pin inside the budget: nothing more is pinned (the limit drops to what is held)."""
        with self._lock:
            self.refused = True
            self.limit = self.held if self.limit is None else min(self.limit, self.held)
        logger.warning("a page-lock was refused at %.2f GiB pinned: the rest of the KV moves through the staging "
                       "ring", self.held / 2**30)

    def give_back(self, tensor: torch.Tensor) -> None:
        """``tensor``'s storage is unlocked now (before the tensor is collected)."""
        key = tensor.untyped_storage().data_ptr()
        with self._lock:
            for charge in [c for c, (k, _) in self._charges.items() if k == key]:
                self._drop(charge)

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s memory is page-locked through this budget (a view of a pinned home counts)."""
        with self._lock:
            return tensor.untyped_storage().data_ptr() in self._storages

    def _release(self, charge: int) -> None:
        with self._lock:
            self._drop(charge)

    def _drop(self, charge: int) -> None:
        found = self._charges.pop(charge, None)
        if found is None:
            return  # given back already
        key, num_bytes = found
        self.held -= num_bytes
        self._storages[key] -= 1
        if not self._storages[key]:
            del self._storages[key]

    def _refusal(self, num_bytes: int) -> str:
        if self.sticky and self.refused and self.limit is not None and self.held + num_bytes <= self.limit:
            return (f"page-locking {num_bytes:,} bytes refused: an earlier pin was refused, and (as under Windows' "
                    "display driver) every later one fails")
        return (f"page-locking {num_bytes:,} bytes refused: {self.held:,} of the {self.limit:,}-byte pin limit "
                f"({ENV_LIMIT}) are held")


@functools.cache
def process_budget() -> PinBudget:
    """The CUDA process's one budget (pins are counted per process): ``HEADINFER_PIN_LIMIT``, or what a probe set."""
    return PinBudget(limit_from_env())


def probe_pinnable(runtime, want: int, *, step: int = 256 << 20, margin: float = 0.15) -> int:
    """How much of ``want`` bytes this machine lets us page-lock: registers ``step``-sized pieces one after another
    (held together, as a store's homes are), stops at the first refusal, clears the runtime's last error so no
    later call reports it, unlocks everything and returns what was locked less ``margin`` (all of ``want`` when
    nothing refused). ``runtime``: ``pinned.CudaRuntime`` or a stand-in (tests)."""
    locked, held = 0, []
    try:
        while locked < want:
            size = min(step, want - locked)
            piece = torch.empty(size, dtype=torch.uint8)
            code = runtime.host_register(piece.data_ptr(), size)
            if code != 0 and code in getattr(runtime, "NO_CONTEXT", ()):
                raise PinningError(f"pin probe: no CUDA context on this thread ({runtime.error_string(code)})")
            if code != 0:
                runtime.clear_last_error()
                logger.info("pin probe: refused after %.2f GiB (%s)", locked / 2**30, runtime.error_string(code))
                return int(locked * (1 - margin))
            held.append(piece)
            locked += size
    finally:
        for piece in held:
            if runtime.host_unregister(piece.data_ptr()) != 0:
                runtime.clear_last_error()
    return want


class DriverRegistration:
    """``cuMemHostRegister`` through the driver API: a refusal is its return code, never a runtime "last error" a
    later, unrelated CUDA call would report (the runtime's path needs ``cudaGetLastError`` after it; see
    ``pinned.CudaRuntime``). Needs the context torch made current on this thread."""

    _PORTABLE = 1  # CU_MEMHOSTREGISTER_PORTABLE
    NO_CONTEXT = (3, 201)  # CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_INVALID_CONTEXT: not a refusal

    def __init__(self, library):
        self._lib = library

    def host_register(self, pointer: int, num_bytes: int) -> int:
        return int(self._lib.cuMemHostRegister_v2(ctypes.c_void_p(pointer), ctypes.c_size_t(num_bytes),
                                                  ctypes.c_uint(self._PORTABLE)))

    def host_unregister(self, pointer: int) -> int:
        return int(self._lib.cuMemHostUnregister(ctypes.c_void_p(pointer)))

    def clear_last_error(self) -> None:
        pass  # the driver API keeps no last error

    def error_string(self, code: int) -> str:
        text = ctypes.c_char_p()
        if self._lib.cuGetErrorString(code, ctypes.byref(text)) != 0 or text.value is None:
            return f"CUresult {code}"
        return text.value.decode(errors="replace")


def driver_registration() -> DriverRegistration | None:
    """The driver library's registration calls (Linux and WSL2: libcuda; Windows: nvcuda), or None."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            library = ctypes.CDLL(name)
            library.cuMemHostRegister_v2  # noqa: B018 (AttributeError where it is not the driver)
        except (OSError, AttributeError):
            continue
        return DriverRegistration(library)
    return None


def pinning_is_capped() -> bool:
    """Where page-locked memory is known to be capped far below the RAM: Windows (WDDM) and WSL2."""
    if sys.platform == "win32":
        return True
    try:
        with open("/proc/version") as version:
            return "microsoft" in version.read().lower()
    except OSError:
        return False


def settle_limit(want: int, *, probe=None, capped: bool | None = None) -> int | None:
    """Sets the CUDA process budget's limit once, at start: ``HEADINFER_PIN_LIMIT`` where set; where pinning is
    capped (Windows, WSL2) what ``probe_pinnable`` finds of ``want`` (at most ``PROBE_CAP``) through the driver
    API; elsewhere none. Returns the limit. ``probe``: (want) -> bytes, a stand-in in tests."""
    budget = process_budget()
    if budget.limit is not None or budget.probed:
        return budget.limit
    budget.probed = True
    capped = pinning_is_capped() if capped is None else capped
    if not capped:
        return None
    want = min(want, PROBE_CAP)
    if probe is None:
        registration = driver_registration()
        if registration is None:
            logger.warning("pin probe: no CUDA driver library found; pins are not capped")
            return None
        probe = functools.partial(probe_pinnable, registration)
    try:
        found = probe(want)
    except PinningError as error:  # (no context current on this thread: nothing was tried)
        logger.warning("%s; pins are not capped", error)
        return None
    budget.limit = found
    logger.info("pin budget: %.2f GiB may be page-locked here (probed, of %.2f GiB tried)", found / 2**30,
                want / 2**30)
    return found
