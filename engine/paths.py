"""Where the studio keeps its files: the one reader of ``HEADINFER_CACHE``.

Downloads, converted models, saved KV caches, measured rates, the self-check report and the native kernel all live
under ``cache_dir()``. Imports nothing of the engine, so every wing (``kv/`` included) may use it.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$HEADINFER_CACHE``, or ``~/.cache/headinfer-studio``."""
    override = os.environ.get("HEADINFER_CACHE")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "headinfer-studio"
