"""Process settings that must be in place before torch loads: ``prepare_process()`` (this module imports no torch,
nor the engine). ``launch.py`` calls it first; a library caller calls it before ``import torch``:

    from process_env import prepare_process; prepare_process()

Each setting keeps a choice the user made in the environment, and a second call changes nothing.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import platform
import sys

logger = logging.getLogger(__name__)


def prepare_process() -> None:
    """The allocator, OpenMP, malloc and Windows-shaped settings, for this process and the processes it starts."""
    use_expandable_segments()
    use_passive_openmp()
    keep_freed_heap()
    use_windows_shape()


# --- the CUDA caching allocator: one growing segment, so a budget held in allocated bytes holds on the card too
# (docs/benchmarks/gpu-h200.md, the reserved bytes). Linux only: the segments need the driver's virtual memory API.
ALLOC_SETTING = "expandable_segments:True"
ALLOC_NAMES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")  # torch 2.9+ reads the first; older ones the second


def use_expandable_segments(environ=os.environ, platform: str = sys.platform) -> str | None:
    """Adds the setting on Linux, appended to the user's value, unless they chose ``expandable_segments`` either way;
    the name of the variable now carrying it (None where nothing was set)."""
    if not platform.startswith("linux"):
        return None
    if any("expandable_segments" in environ.get(name, "") for name in ALLOC_NAMES):
        return None  # the user's choice stands
    name = next((name for name in ALLOC_NAMES if environ.get(name)), "PYTORCH_CUDA_ALLOC_CONF")
    current = environ.get(name, "").rstrip(",")
    environ[name] = f"{current},{ALLOC_SETTING}" if current else ALLOC_SETTING
    return name


# --- OpenMP: torch's idle threads sleep instead of spinning on the cores the engine's C pools compute on ---
# (docs/benchmarks/llamacpp-1.5b-epyc.md, the decode step at 2K). OpenMP reads it once, when the library loads.
OMP_NAME, OMP_SETTING = "OMP_WAIT_POLICY", "PASSIVE"


def use_passive_openmp(environ=os.environ) -> bool:
    """Sets ``OMP_WAIT_POLICY=PASSIVE`` unless the user chose a policy; whether it set it."""
    if environ.get(OMP_NAME):
        return False
    environ[OMP_NAME] = OMP_SETTING
    return True


# --- glibc malloc: a prefill's large temporaries, made and freed chunk after chunk, reuse the heap's pages instead of
# fresh ones the kernel zeroes (docs/benchmarks/llamacpp-1.5b-epyc.md, prefill at 2K). One arena: a worker thread's
# own arenas are unmapped as soon as they are free, whatever the trim threshold.
MMAP_THRESHOLD = 32 << 20  # glibc refuses more than HEAP_MAX_SIZE / 2 (32 MiB on 64-bit)
TRIM_THRESHOLD = 256 << 20
ARENAS = 1
MALLOC_ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD, "MALLOC_TRIM_THRESHOLD_": TRIM_THRESHOLD,
                      "MALLOC_ARENA_MAX": ARENAS}
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # mallopt's parameter numbers (malloc.h)


def users_choice(environ) -> bool:
    """Whether the environment already sets any of these glibc malloc settings (the user's choice stands)."""
    return any(name in environ for name in MALLOC_ENVIRONMENT) or "glibc.malloc." in environ.get("GLIBC_TUNABLES", "")


def for_children(environ) -> bool:
    """Puts the settings in ``environ`` for processes started with it (glibc reads them at start), unless the
    user chose them; whether it did."""
    if users_choice(environ):
        return False
    environ.update({name: str(value) for name, value in MALLOC_ENVIRONMENT.items()})
    return True


def keep_freed_heap(environ=os.environ, libc=None) -> bool:
    """Sets glibc malloc's thresholds and its one arena for this process (``mallopt``) and its children
    (``environ``), unless the user chose them or the C library is not glibc; whether it set them. Before the process
    starts threads (a thread keeps the arena it first allocated from). ``libc``: the library to call (tests)."""
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


# --- the Windows-shaped run (HEADINFER_WINDOWS_SHAPED=1, docs/windows.md): Windows starts children by spawn only and
# its driver caps pinned memory; the engine's other Windows choices read the switch in engine.paths_windows.
WINDOWS_SHAPED = "HEADINFER_WINDOWS_SHAPED"  # engine.paths_windows.ENV
PIN_LIMIT_NAME, PIN_LIMIT = "HEADINFER_PIN_LIMIT", "64MiB"  # engine.kv.pin_budget.ENV_LIMIT; a capped PC's, made small


def use_windows_shape(environ=os.environ) -> bool:
    """In the Windows-shaped mode: ``spawn`` for every child process and the pin limit (a limit the user set is
    kept); whether the mode is on. Before any child process is made."""
    if not shaped(environ):
        return False
    multiprocessing.set_start_method("spawn", force=True)
    environ.setdefault(PIN_LIMIT_NAME, PIN_LIMIT)
    return True


def shaped(environ=os.environ) -> bool:
    """Whether ``HEADINFER_WINDOWS_SHAPED=1`` (the app's fallbacks read it here: app/ imports only engine's public
    names, and ``engine.paths_windows.windows_shaped`` reads the same variable)."""
    return environ.get(WINDOWS_SHAPED, "").strip() == "1"
