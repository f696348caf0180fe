"""Uploaded files: a folder of this process's own for Gradio to keep them in, and deleting them once the
tab that uploaded them closes, so a visitor's file is not left on disk, downloadable by its URL."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

import psutil

logger = logging.getLogger(__name__)

_PREFIX = "pid-"


def prepare_folder(root: Path, *, uid: int | None = None) -> Path:
    """A folder of this process's own under ``root``, created empty; the folders of processes that no
    longer run (a crash, a kill) are deleted with what they hold: uploads, per-tab saved documents.

    ``root`` must be this user's (``uid``, default the process's): created 0700, or, when it is there already,
    owned by them and no symbolic link (its mode is then narrowed to 0700). Someone else's ``root`` (a shared
    ``/tmp`` where another user started first, or planted it) is left alone and a fresh private folder of a
    random name is used instead, with a warning: start-up never stops on another user's folder."""
    root = own_folder(root, uid=uid)
    for child in root.iterdir():
        pid = _pid(child.name)
        if pid is not None and pid != os.getpid() and not _is_running(pid):
            logger.info("deleting %s, left by an app that stopped", child)
            shutil.rmtree(child, ignore_errors=True)
    folder = root / f"{_PREFIX}{os.getpid()}"
    shutil.rmtree(folder, ignore_errors=True)  # a reused process id
    folder.mkdir(mode=0o700)
    return folder


def own_folder(path: Path, *, uid: int | None = None) -> Path:
    """``path`` when it is (or is now created as) a folder of ``uid``'s own, mode 0700; else a fresh private folder
    beside it (``tempfile.mkdtemp``: a random name, 0700, never someone else's), with a warning saying why."""
    uid = _uid() if uid is None else uid
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.lstat()
        problem = None
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            problem = "is not a folder (a link or a file)"
        elif uid is not None and info.st_uid != uid:
            problem = f"belongs to another user (uid {info.st_uid})"
        elif stat.S_IMODE(info.st_mode) & 0o077:
            os.chmod(path, 0o700)  # ours: only we may read what visitors upload
    except OSError as exc:
        problem = f"cannot be used ({exc.strerror or exc})"
    if problem is None:
        return path
    fresh = Path(tempfile.mkdtemp(prefix=f"{path.name}-", dir=path.parent if path.parent.is_dir() else None))
    logger.warning("%s %s; using a private folder of this process's own instead: %s", path, problem, fresh)
    return fresh


def _uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None  # no owners to compare on Windows


def delete_uploads(paths: Iterable[str], folder: Path) -> int:
    """Deletes the uploaded files among ``paths`` that lie inside ``folder`` (and their emptied
    per-upload folders); returns how many files went."""
    folder = folder.resolve()
    deleted = 0
    for path in {Path(p).resolve() for p in paths}:
        if not path.is_relative_to(folder) or path == folder:
            continue  # never touch anything outside the upload folder
        try:
            path.unlink()
            deleted += 1
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("could not delete the upload %s: %s", path, exc)
            continue
        parent = path.parent
        while parent != folder and parent.is_relative_to(folder):
            try:
                parent.rmdir()  # only when empty
            except OSError:
                break
            parent = parent.parent
    return deleted


def _pid(name: str) -> int | None:
    if not name.startswith(_PREFIX):
        return None
    try:
        return int(name[len(_PREFIX):])
    except ValueError:
        return None


def _is_running(pid: int) -> bool:
    # psutil, not os.kill(pid, 0): on Windows os.kill terminates the process whatever the signal.
    return psutil.pid_exists(pid)
