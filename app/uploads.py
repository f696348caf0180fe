"""Uploaded files: a folder of this process's own for Gradio to keep them in, and deleting them once the
tab that uploaded them closes, so a visitor's file is not left on disk, downloadable by its URL."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

_PREFIX = "pid-"


def prepare_folder(root: Path) -> Path:
    """A folder of this process's own under ``root``, created empty; the folders of processes that no
    longer run (a crash, a kill) are deleted with what they hold: uploads, per-tab saved documents."""
    root.mkdir(parents=True, exist_ok=True)
    for child in root.iterdir():
        pid = _pid(child.name)
        if pid is not None and pid != os.getpid() and not _is_running(pid):
            logger.info("deleting %s, left by a run that stopped", child)
            shutil.rmtree(child, ignore_errors=True)
    folder = root / f"{_PREFIX}{os.getpid()}"
    shutil.rmtree(folder, ignore_errors=True)  # a reused process id
    folder.mkdir()
    return folder


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
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True
