"""Who owns a saved-documents folder, so that what a killed save left behind goes at the next start.

A save writes the snapshot into a ``.tmp-*`` folder and renames it into place; ``kill -9`` part-way leaves the
folder (tens of MB to GBs). Each app process holds an owner lock in the folder for as long as it lives:
``.owner-<pid>.lock``, ``flock``-ed, so the kernel releases it the moment the process dies (``kill -9`` too).
At start, a lock nobody holds belongs to a dead process and goes; a ``.tmp-*`` (or ``.trash-*``) folder older
than every live owner's start can only have been left by a dead one, and goes too. Until then the saved list
counts it ("interrupted save").
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from pathlib import Path

from app.disk_usage import folder_bytes

logger = logging.getLogger(__name__)

LOCK_PREFIX = ".owner-"
LEFTOVER_PREFIXES = (".tmp-", ".trash-")  # engine.store.files.TEMP_PREFIX and the store's trash

_held: dict[Path, object] = {}  # root -> this process's open, locked file (kept open for the process's life)


def claim(root: Path) -> int:
    """Marks ``root`` as used by this process, after removing what dead owners left; returns the bytes removed."""
    root = Path(root)
    if root in _held:
        return 0
    removed = sweep(root)
    path = root / f"{LOCK_PREFIX}{os.getpid()}.lock"
    try:
        handle = open(path, "w")  # noqa: SIM115 - held open (and locked) for the process's life
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        handle.write(str(os.getpid()))
        handle.flush()
    except OSError as exc:  # a read-only folder: nothing to save there, nothing to own
        logger.info("could not mark %s as in use: %s", root, exc)
        return removed
    _held[root] = handle
    return removed


def sweep(root: Path) -> int:
    """Removes dead owners' locks and the leftovers only a dead owner can have left; returns the bytes removed."""
    live_since = []
    for lock in root.glob(f"{LOCK_PREFIX}*.lock"):
        if lock.name == f"{LOCK_PREFIX}{os.getpid()}.lock":
            continue
        try:
            with open(lock) as handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # held: its owner is alive
                    live_since.append(lock.stat().st_mtime)
                    continue
            lock.unlink(missing_ok=True)  # nobody holds it: its process is gone
        except OSError:
            continue
    oldest_live = min(live_since, default=float("inf"))
    removed = 0
    for folder, size, mtime in _leftovers(root):
        if mtime < oldest_live:
            logger.info("removing %s (%.1f MB) left by an interrupted save", folder, size / 1e6)
            shutil.rmtree(folder, ignore_errors=True)
            removed += size
    return removed


def leftover_bytes(root: Path) -> int:
    """Bytes in interrupted saves' folders still on disk (removed at the next start when their owner is gone)."""
    return sum(size for _, size, _ in _leftovers(Path(root)))


def _leftovers(root: Path) -> list[tuple[Path, int, float]]:
    found = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return found
    for path in entries:
        if path.name.startswith(LEFTOVER_PREFIXES) and path.is_dir():
            try:
                found.append((path, folder_bytes(path), path.stat().st_mtime))
            except OSError:
                continue
    return found
