"""How many bytes a folder's files take: the one walk the shelves' caps, the upload budget and the store's
leftover count share."""

from __future__ import annotations

import os
from pathlib import Path


def folder_bytes(folder: Path | None) -> int:
    """Bytes of the files under ``folder`` (0 when it is None or missing); links are counted, not followed."""
    if folder is None:
        return 0
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:  # deleted meanwhile
                pass
    return total
