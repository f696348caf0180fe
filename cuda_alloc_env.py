"""The CUDA caching allocator's settings, set before torch loads (this module imports no torch).

``expandable_segments:True``: the allocator grows one mapped segment instead of caching fixed-size blocks, so
tensors that grow chunk by chunk (a prefill's attention over an ever longer past) reuse the same memory instead
of leaving a trail of too-small cached blocks. On the first GPU run (H200, 100K-token prefill, 24 GiB budget)
allocation peaked at 23.45e9 bytes within a 23.59e9 plan, but the allocator had reserved 25.68e9: the budget
held in allocated bytes, not on the card. Linux only (the segments need the driver's virtual memory API).
"""

from __future__ import annotations

import os
import sys

SETTING = "expandable_segments:True"
# torch 2.9+ reads PYTORCH_ALLOC_CONF first; older ones only the CUDA-specific name.
NAMES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def use_expandable_segments(environ=os.environ, platform: str = sys.platform) -> str | None:
    """Adds ``expandable_segments:True`` to the allocator settings on Linux, keeping the user's: appended to a
    value already set, and no change where the user chose ``expandable_segments`` either way. Returns the name
    of the variable now carrying it (None where nothing was set). Call it before ``import torch``."""
    if not platform.startswith("linux"):
        return None
    if any("expandable_segments" in environ.get(name, "") for name in NAMES):
        return None  # the user's choice stands
    name = next((name for name in NAMES if environ.get(name)), "PYTORCH_CUDA_ALLOC_CONF")
    current = environ.get(name, "").rstrip(",")
    environ[name] = f"{current},{SETTING}" if current else SETTING
    return name
