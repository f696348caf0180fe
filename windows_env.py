"""The Windows-shaped run's start (``HEADINFER_WINDOWS_SHAPED=1``), set before torch loads (this module imports no
torch, nor the engine).

Windows starts child processes by ``spawn`` only, and its display driver caps pinned memory: the switch makes this
(Linux) process the same, ``spawn`` as the default start method and a 64 MiB pin limit (``HEADINFER_PIN_LIMIT``,
unless one is set), so nothing here may count on ``fork`` or on pinning the whole KV store. The engine's other
Windows choices (no compiler, no hard links, NTFS names) read the switch in ``engine.paths_windows``.
"""

from __future__ import annotations

import multiprocessing
import os

NAME = "HEADINFER_WINDOWS_SHAPED"  # engine.paths_windows.ENV
PIN_LIMIT_NAME, PIN_LIMIT = "HEADINFER_PIN_LIMIT", "64MiB"  # engine.kv.pin_budget.ENV_LIMIT; a capped PC's, made small


def use_windows_shape(environ=os.environ) -> bool:
    """In the Windows-shaped mode: ``spawn`` for every child process and the pin limit (a limit the user set is
    kept); whether the mode is on. Call it at a process's start, before any child process is made."""
    if not shaped(environ):
        return False
    multiprocessing.set_start_method("spawn", force=True)
    environ.setdefault(PIN_LIMIT_NAME, PIN_LIMIT)
    return True


def shaped(environ=os.environ) -> bool:
    """Whether ``HEADINFER_WINDOWS_SHAPED=1`` (the app's fallbacks read it here: app/ imports only engine's public
    names, and ``engine.paths_windows.windows_shaped`` reads the same variable)."""
    return environ.get(NAME, "").strip() == "1"
