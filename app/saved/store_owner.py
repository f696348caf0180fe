"""Who owns a saved-documents folder, so that what a killed save left behind goes at the next start.

A save writes the snapshot into a ``.tmp-*`` folder and renames it into place; ``kill -9`` part-way leaves the
folder (tens of MB to GBs). Each app process holds an owner lock in the folder for as long as it lives:
``.owner-<pid>.lock``, ``flock``-ed, so the kernel releases it the moment the process dies (``kill -9`` too);
without ``flock`` (Windows) the process of that id, started before the lock was written, is the live owner.
At start, a lock nobody holds belongs to a dead process and goes; a ``.tmp-*`` (or ``.trash-*``) folder older
than every live owner's start can only have been left by a dead one, and goes too. Until then the saved list
counts it ("interrupted save").
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import psutil

from app.disk_usage import folder_bytes
from process_env import shaped

try:
    import fcntl
except ImportError:  # Windows: a lock's owner is found by its process id instead (``_owner_alive``)
    fcntl = None

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
        if _can_flock():
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
            if _owner_alive(lock):
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


def _can_flock() -> bool:
    return fcntl is not None and not shaped()  # the Windows-shaped run takes Windows' path


def _owner_alive(lock: Path) -> bool:
    """Whether the process that made ``lock`` still runs: its ``flock`` is held; without ``flock`` (Windows), a
    process of the id in its name runs and started before the lock was written (not a later one given the id)."""
    if _can_flock():
        with open(lock) as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # held: its owner is alive
                return True
        return False
    try:
        pid = int(lock.name[len(LOCK_PREFIX):-len(".lock")])
        return psutil.Process(pid).create_time() <= lock.stat().st_mtime + 1
    except (ValueError, psutil.Error):
        return False


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
