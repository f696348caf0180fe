"""Native libraries this studio built, never ones planted: the kernel folder is the user's own, and a library in it
is loaded only when its bytes hash to what the build that wrote it recorded.

A library's file name says what it was built from (sources, compiler, flags), not that we built it: anyone who
could write the folder could put a library there under that name, and loading it runs its constructors. So:

- ``kernel_folder()``: ``cache_dir()/kernels``, created 0700; an existing one must be owned by this user and
  writable by nobody else (its parent not by everyone, unless sticky), else a fresh private folder is used for this process
  (logged) and handed to the crash probes' children (``child_env``).
- ``load(name, build)``: the library ``name`` in it when its SHA-256 equals its build record (``<name>.json``
  beside it, written atomically by the build); otherwise (no record, another hash, truncated) it is rebuilt:
  ``build`` compiles into a scratch name, the bytes are hashed and recorded, and the file renamed into place.

Windows: there is no uid and no group/other write bits (``os.stat`` reports the read-only flag only), so the
ownership and mode checks are skipped; the folder sits under the user's profile, whose ACL is the user's, and the
hash record still refuses a library the build did not write.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..paths import cache_dir

logger = logging.getLogger(__name__)

#: the private folder a parent process fell back to, for its children (checked there as any folder is)
PRIVATE_FOLDER_ENV = "HEADINFER_PRIVATE_KERNELS"
_RECORD_SUFFIX = ".json"
_FALLBACKS: dict[Path, Path] = {}  # requested folder -> the private one this process uses instead
_LOCK = threading.Lock()


def kernel_folder() -> Path:
    """The folder the kernels are built into and loaded from: ``cache_dir()/kernels`` when it is this user's own,
    else a private folder for this process (logged once)."""
    requested = cache_dir() / "kernels"
    with _LOCK:
        if requested in _FALLBACKS:
            return _FALLBACKS[requested]
        problem = unsafe_reason(requested)
        if problem is None:
            return requested
        handed = os.environ.get(PRIVATE_FOLDER_ENV)
        if handed and unsafe_reason(Path(handed), create=False) is None:
            fallback = Path(handed)  # the parent's private folder: the probe's child loads what the parent built
        else:
            fallback = Path(tempfile.mkdtemp(prefix="headinfer-kernels-"))  # 0700, a name nobody could guess
            atexit.register(shutil.rmtree, fallback, True)
        logger.warning("the kernel folder %s is %s: native kernels are built into the private folder %s for this "
                       "run instead (fix the folder's owner or mode to keep them between runs)", requested, problem,
                       fallback)
        _FALLBACKS[requested] = fallback
        return fallback


def child_env() -> dict[str, str]:
    """What a child process needs in its environment to use this process's kernel folder (a private fallback)."""
    folder = kernel_folder()
    return {PRIVATE_FOLDER_ENV: str(folder)} if folder != cache_dir() / "kernels" else {}


def unsafe_reason(folder: Path, *, create: bool = True) -> str | None:
    """Why ``folder`` may not hold libraries this process loads (None: it may): not a folder, another user's, or
    writable by others. Created 0700 first where missing (``create``)."""
    try:
        if create:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.stat(folder)  # through a link: the folder the files would be in
        parent = os.stat(folder.parent)
    except OSError as error:
        return f"unusable ({error})"
    if not stat.S_ISDIR(info.st_mode):
        return "not a folder"
    if os.name == "nt":  # no owner or mode bits to check (see the module docstring)
        return None
    if info.st_uid != os.getuid():
        return f"owned by another user (uid {info.st_uid}, this process runs as {os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by other users (mode {stat.S_IMODE(info.st_mode):o})"
    # A parent anyone may write (and not sticky, as /tmp is) lets them rename the folder away and put theirs there.
    if parent.st_mode & stat.S_IWOTH and not parent.st_mode & stat.S_ISVTX:
        return f"in a folder other users may write ({folder.parent}, mode {stat.S_IMODE(parent.st_mode):o})"
    return None


def load(name: str, build: Callable[[Path], None]) -> ctypes.CDLL:
    """The library ``name`` of the kernel folder, loaded only when its bytes match the record its build wrote;
    otherwise rebuilt first: ``build(path)`` writes the library at ``path`` (a scratch folder of its own, which it
    may use for intermediate files) or raises ``OSError``/``subprocess.SubprocessError``."""
    folder = kernel_folder()
    target = folder / name
    if _matches_record(target):
        return ctypes.CDLL(str(target))
    with tempfile.TemporaryDirectory(dir=folder, prefix=".build-") as scratch:
        built = Path(scratch) / name
        build(built)
        digest, size = file_sha256(built)
        _write_record(target, digest, size)
        os.replace(built, target)  # atomic: a concurrent process loads the old file or the complete new one
    return ctypes.CDLL(str(target))


def record_path(target: Path) -> Path:
    """Where the build record of library ``target`` lives."""
    return target.with_name(target.name + _RECORD_SUFFIX)


def file_sha256(path: Path) -> tuple[str, int]:
    """(SHA-256 hex, bytes) of the file at ``path``."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


def _matches_record(target: Path) -> bool:
    """Whether ``target`` exists and hashes to its build record (a mismatch is logged: it is then rebuilt)."""
    if not target.exists():
        return False
    try:
        record = json.loads(record_path(target).read_text())
        expected, expected_size = str(record["sha256"]), int(record["bytes"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        logger.warning("%s has no valid build record (%s): not loaded; building it again", target, error)
        return False
    try:
        digest, size = file_sha256(target)
    except OSError as error:
        logger.warning("cannot read %s (%s): building it again", target, error)
        return False
    if (digest, size) != (expected, expected_size):
        logger.warning("%s is not the library its build recorded (%d bytes, sha256 %s..., recorded %d bytes, %s...): "
                       "not loaded; building it again", target, size, digest[:12], expected_size, expected[:12])
        return False
    return True


def _write_record(target: Path, digest: str, size: int) -> None:
    body = json.dumps({"library": target.name, "sha256": digest, "bytes": size, "built": time.time()})
    with tempfile.NamedTemporaryFile("w", dir=target.parent, prefix=".record-", delete=False) as file:
        file.write(body)
        file.flush()
        os.fsync(file.fileno())
    os.replace(file.name, record_path(target))
