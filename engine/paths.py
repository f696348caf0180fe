"""Where the studio keeps its files: the one reader of ``HEADINFER_CACHE``.

Downloads, converted models, saved KV caches, measured rates, the self-check report and the native kernel all live
under ``cache_dir()``. Imports nothing of the engine but ``paths_windows`` (which imports nothing), so every wing
(``kv/`` included) may use it.
"""

from __future__ import annotations

import os
from pathlib import Path

from .paths_windows import UNDER_CACHE, windows_path


def cache_dir() -> Path:
    """``$HEADINFER_CACHE``, or ``~/.cache/headinfer-studio``; on Windows in the form its files' long paths need
    (``paths_windows.windows_path``)."""
    override = os.environ.get("HEADINFER_CACHE")
    folder = Path(override).expanduser() if override else Path.home() / ".cache" / "headinfer-studio"
    return windows_path(folder, UNDER_CACHE, "HEADINFER_CACHE")
