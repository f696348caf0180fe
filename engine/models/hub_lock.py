"""Trust on first use for Hub models whose revision is a branch: a lock file, as a package manager keeps one.

A catalogue entry whose ``revision`` is ``main`` (no commit recorded yet) is pinned on this machine by its first
download: the commit ``main`` resolved to, with the file list (sizes, and the SHA-256 the Hub gives for LFS files),
goes into ``revisions.lock.json`` in the studio's own cache folder (``engine.paths.cache_dir``). Every later
download, resume and offline lookup of that repository uses the locked commit, so a repository changed upstream
after the first download does not change what this machine runs; moving to the branch's newer commit is the owner's
explicit update (``downloads.update_pin``). The file is written atomically (a temporary file, fsync, rename) and a
damaged one is refused with its path and what to do, never read as empty. Two processes pinning at once (two apps,
an app and a CLI download) each read, merge and write under one exclusive lock on a file beside it (``filelock``:
``flock`` on POSIX, ``msvcrt.locking`` on Windows, let go by the OS when its holder dies), so neither pin is lost.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from ..errors import DamagedRevisionLock
from ..paths import cache_dir

logger = logging.getLogger(__name__)

LOCK_NAME = "revisions.lock.json"
VERSION = 1
COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
HOWS = ("download", "cache", "update")  # how the commit was pinned: fetched, found already cached, owner's update
_WRITING = threading.Lock()  # one read-modify-write at a time in this process (the file lock: across processes)
WRITING_SUFFIX = ".writing"  # the file beside the lock file that writers lock
WAIT_SECONDS = 60.0  # a writer holds the lock for one small write: a minute's wait is another process stuck


@dataclass(frozen=True)
class LockedFile:
    path: str
    size: int
    sha256: str | None  # the Hub lists one for LFS files only


@dataclass(frozen=True)
class Locked:
    """One repository's pin: ``sha`` is what ``branch`` resolved to when ``how`` happened (UTC ``locked_at``)."""

    repo_id: str
    sha: str
    branch: str
    how: str
    locked_at: str
    files: tuple[LockedFile, ...] = ()  # empty: not recorded (pinned from a snapshot already in the cache)

    @property
    def short(self) -> str:
        return self.sha[:7]


def lock_path() -> Path:
    return cache_dir() / LOCK_NAME


def read_lock(path: Path | None = None) -> dict[str, Locked]:
    """Every pin in the lock file (none when it does not exist yet); ``DamagedRevisionLock`` when it cannot be read."""
    path = path or lock_path()
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as error:
        raise _damaged(path, f"unreadable: {error}") from error
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as error:
        raise _damaged(path, f"not JSON: {error}") from error
    try:
        return _parse(data, path)
    except (KeyError, TypeError, AttributeError) as error:
        raise _damaged(path, f"{type(error).__name__}: {error}") from error


def locked(repo_id: str, path: Path | None = None) -> Locked | None:
    return read_lock(path).get(repo_id)


def record(pin: Locked, path: Path | None = None) -> None:
    """Writes ``pin`` (replacing any earlier pin of its repository) and keeps every other pin as it was."""
    path = path or lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    writing = path.with_name(path.name + WRITING_SUFFIX)  # kept on POSIX: another waiter may hold it open
    try:
        with _WRITING, FileLock(writing, timeout=WAIT_SECONDS):
            pins = read_lock(path)  # a damaged file is refused here too: nothing is written over it
            pins[pin.repo_id] = pin
            _write(path, pins)
    except Timeout as error:
        raise OSError(f"{writing} stayed locked for {WAIT_SECONDS:.0f} s: another studio process is writing "
                      f"{path.name} and has not finished; try again, or end that process") from error
    logger.info("%s pinned to %s (%s of %s)", pin.repo_id, pin.sha, pin.how, pin.branch)


def new_pin(repo_id: str, sha: str, branch: str, how: str, files: tuple[LockedFile, ...] = ()) -> Locked:
    return Locked(repo_id, sha, branch, how, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), files)


def _parse(data, path: Path) -> dict[str, Locked]:
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("repos"), dict):
        raise _damaged(path, f"expected {{'version': {VERSION}, 'repos': {{...}}}}")
    pins = {}
    for repo_id, item in data["repos"].items():
        sha, how = item["sha"], item["how"]
        if not isinstance(sha, str) or not COMMIT.match(sha):
            raise _damaged(path, f"{repo_id}: {sha!r} is not a commit hash")
        if how not in HOWS:
            raise _damaged(path, f"{repo_id}: unknown 'how' {how!r}")
        files = []
        for entry in item["files"]:
            size, digest = entry["size"], entry.get("sha256")
            if not isinstance(entry["path"], str) or not isinstance(size, int) or size < 0:
                raise _damaged(path, f"{repo_id}: a file entry is malformed: {entry!r}")
            if digest is not None and not (isinstance(digest, str) and _SHA256.match(digest)):
                raise _damaged(path, f"{repo_id}: {entry['path']}'s sha256 is malformed")
            files.append(LockedFile(entry["path"], size, digest))
        pins[repo_id] = Locked(repo_id, sha, str(item["branch"]), how, str(item["locked_at"]), tuple(files))
    return pins


def _write(path: Path, pins: dict[str, Locked]) -> None:
    payload = {"version": VERSION, "repos": {
        repo_id: {"sha": p.sha, "branch": p.branch, "how": p.how, "locked_at": p.locked_at,
                  "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in p.files]}
        for repo_id, p in sorted(pins.items())}}
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    if os.name == "posix":  # the rename itself survives a power cut once the folder is synced
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def _damaged(path: Path, reason: str) -> DamagedRevisionLock:
    return DamagedRevisionLock(
        f"{path} is damaged ({reason}). It records the Hub commit each model was pinned to at its first download, "
        f"so downloads of those models stop rather than guess. Restore it from a backup, or delete it to pin each "
        f"model again at its next download (that download then fetches whatever the Hub holds that day).")
