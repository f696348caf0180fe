"""glibc malloc keeps the memory of freed large tensors for the next ones (this module imports no torch).

A CPU prefill allocates the same large temporaries chunk after chunk and layer after layer: Qwen2.5-1.5B's MLP at a
512-token chunk makes four [512, 8960] fp32 tensors (18 MiB each) per layer. glibc hands out blocks over its mmap
threshold (128 KiB, rising to the largest block freed) as fresh pages and gives them back on free; blocks under it
come from the heap, whose free top it returns past a trim threshold (twice the mmap one). So every chunk's
temporaries were new pages, each page zeroed by the kernel on its first touch: 2.1 million page faults in a 2K-token
read of the CPU default model, against 0.17 million with the thresholds below, and the read 118 -> 133 tok/s on two
cores, 66 -> 73 on one (alternating processes; the memory peak +30-90 MB of 1.6 GB).

- mmap threshold 32 MiB (glibc's largest on 64-bit): blocks under it come from the heap;
- trim threshold 256 MiB: up to that much free memory at the heap's top stays mapped for the next chunk;
- one arena: the app computes on a worker thread, and a thread's own arena is a chain of 64 MiB heaps that glibc
  unmaps as soon as one is wholly free, whatever the trim threshold. The same 2K read on a worker thread: 0.73
  million faults with the thresholds alone, 0.17 million with one arena. The app's threads allocate little
  besides the compute's tensors, so they hardly contend for it.

Set for this process through ``mallopt`` and, through glibc's environment variables, for the processes it starts.
A choice the user made in the environment (any of these variables, or ``GLIBC_TUNABLES`` naming a malloc tunable)
is kept; other C libraries are left alone.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

logger = logging.getLogger(__name__)

MMAP_THRESHOLD = 32 << 20  # glibc refuses more than HEAP_MAX_SIZE / 2 (32 MiB on 64-bit)
TRIM_THRESHOLD = 256 << 20
ARENAS = 1
ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD, "MALLOC_TRIM_THRESHOLD_": TRIM_THRESHOLD,
               "MALLOC_ARENA_MAX": ARENAS}
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # mallopt's parameter numbers (malloc.h)


def users_choice(environ) -> bool:
    """Whether the environment already sets any of these glibc malloc settings (the user's choice stands)."""
    return any(name in environ for name in ENVIRONMENT) or "glibc.malloc." in environ.get("GLIBC_TUNABLES", "")


def for_children(environ) -> bool:
    """Puts the settings in ``environ`` for processes started with it (glibc reads them at start), unless the
    user chose them; whether it did."""
    if users_choice(environ):
        return False
    environ.update({name: str(value) for name, value in ENVIRONMENT.items()})
    return True


def keep_freed_heap(environ=os.environ, libc=None) -> bool:
    """Sets glibc malloc's mmap and trim thresholds and its one arena for this process (``mallopt``) and for its
    children (``environ``), unless the user chose them or the C library is not glibc; whether it set them. Call it
    before the process starts threads (a thread keeps the arena it first allocated from). ``libc``: the library to
    call (tests); default the process's own."""
    if users_choice(environ):
        return False
    if libc is None:
        if platform.libc_ver()[0] != "glibc":
            return False
        libc = ctypes.CDLL(None)  # the process's own C library, where malloc lives
    settings = ((_M_TRIM_THRESHOLD, TRIM_THRESHOLD), (_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_ARENA_MAX, ARENAS))
    if not all([libc.mallopt(parameter, value) == 1 for parameter, value in settings]):
        logger.info("malloc thresholds not set (mallopt refused): large temporaries stay fresh pages")
        return False
    return for_children(environ)
