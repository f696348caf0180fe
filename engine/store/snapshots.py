"""Save a prefilled document's KV cache to disk and restore it at disk speed instead of prefilling.

    store = SnapshotStore(max_bytes=50 << 30)      # default folder: cache_dir() / "kv"
    session.set_document(text)
    if session.restore_snapshot(store) is None:    # none saved, or unusable: read it the slow way
        session.prefill()
        session.save_snapshot(store)

The store works on what it is given: a cache, the document's token ids and their ``SnapshotIdentity``
(``DocumentSession`` passes its own; this module never reaches into a session). A snapshot is keyed by
the model, its K/V dtype, the tokenizer and the document's token ids, so ``find`` only ever returns one
made for this exact identity. The store keeps its total size under
``max_bytes`` by evicting the least recently used snapshots. The format is described in
``engine.store.format``.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import CorruptSnapshotError, InputError, SnapshotError
from ..paths import cache_dir
from ..paths_windows import UNDER_STORE, windows_path
from ..planning.machine import format_bytes
from .files import (
    TEMP_PREFIX,
    check_sidecar_name,
    read_snapshot,
    snapshot_bytes,
    snapshot_refusal,
    write_atomically,
    write_snapshot,
)
from .format import (
    LAST_USED_FILE,
    PREVIOUS_HEADER_FILE,
    SnapshotHeader,
    SnapshotIdentity,
    check_compatible,
    read_header,
)

if TYPE_CHECKING:
    from ..cache import HeadInferCache

logger = logging.getLogger(__name__)

_STALE_SECONDS = 3600  # a temporary folder this old belongs to a writer that crashed
_TRASH_PREFIX = ".trash-"
_KEY = re.compile(r"^[0-9a-f]{32}$")
_LABEL_CHARS = 80

__all__ = ["CorruptSnapshotError", "RestoreStats", "SnapshotError", "SnapshotInfo", "SnapshotStore"]


@dataclass(frozen=True)
class SnapshotInfo:
    """One saved snapshot, as listed by the store."""

    key: str
    label: str  # the start of the document, for people
    num_tokens: int
    num_bytes: int
    created: float  # seconds since the epoch
    last_used: float
    model: str  # the model's folder or Hub id
    dtype: str
    path: Path
    is_readable: bool = True  # False: the header is damaged; the snapshot can only be deleted
    num_read: int | None = None  # a read in progress, checkpointed: the first tokens it holds (None: complete)
    read_seconds: float = 0.0  # the reading time those tokens took

    @property
    def is_partial(self) -> bool:
        return self.num_read is not None

    @property
    def fraction_read(self) -> float:
        return 1.0 if self.num_read is None else self.num_read / max(self.num_tokens, 1)

    @property
    def remaining_seconds(self) -> float | None:
        """A partial read's rest at its rate so far (later tokens cost a little more: a floor); None when unknown."""
        if self.num_read is None or self.read_seconds <= 0 or not self.num_read:
            return None
        return (self.num_tokens - self.num_read) * self.read_seconds / self.num_read


@dataclass(frozen=True)
class RestoreStats:
    """How a restore went: what was read and how fast."""

    num_tokens: int
    num_bytes: int
    seconds: float

    @property
    def gb_per_second(self) -> float:
        return self.num_bytes / max(self.seconds, 1e-9) / 1e9


class SnapshotStore:
    """A folder of KV-cache snapshots with a size cap and least-recently-used eviction.

    Args:
        root: the folder; default ``engine.models.loader.cache_dir() / "kv"``. Created if missing.
        max_bytes: the most the snapshots may take together; ``None`` for no cap. A snapshot larger
            than the cap on its own is not saved (a warning is logged).
    """

    def __init__(self, root: Path | str | None = None, max_bytes: int | None = None):
        if max_bytes is not None and max_bytes < 0:
            raise InputError(f"max_bytes must be >= 0 or None, got {max_bytes!r}")
        if root is None:
            root = cache_dir() / "kv"
        self.root = windows_path(Path(root).expanduser(), UNDER_STORE, "--kv-cache-dir")  # (Win32's path limit)
        self.max_bytes = max_bytes
        self.root.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temporaries()

    # -- the public API --------------------------------------------------------------------------
    def save(self, cache: HeadInferCache, token_ids: list[int], identity: SnapshotIdentity, *, label: str = "",
             policy: dict | None = None, sidecar: tuple[tuple[str, str], ...] = ()) -> SnapshotInfo | None:
        """Saves the first ``identity.num_tokens`` tokens of ``cache`` (whose ids are ``token_ids``); returns
        its info, or None if over the size cap.

        ``sidecar``: (file name, text) pairs kept beside the K/V (the app's shelf entry: the document's text),
        written and fsynced inside the snapshot before it is renamed into place, so a snapshot is never listed
        without them (a snapshot already saved gets them replaced atomically).

        A snapshot already saved for the same key is kept (and marked used) rather than rewritten.
        Raises ``ValueError`` if the cache does not hold those tokens, ``OSError`` if the disk fails or is
        full (nothing partial is left behind).
        """
        if len(token_ids) != identity.num_tokens:
            raise InputError(f"{len(token_ids):,} token ids for an identity of {identity.num_tokens:,} tokens")
        refusal = snapshot_refusal(cache.shape)
        if refusal is not None:  # before a byte is written: never a snapshot that no restore accepts
            logger.warning("not saving a snapshot: %s", refusal)
            raise SnapshotError(refusal)
        existing = self._readable_info(identity.key)
        if existing is not None and not existing.is_partial:  # a partial read is replaced by the whole
            for name, text in sidecar:
                check_sidecar_name(name)
                write_atomically(existing.path / name, text.encode("utf-8"))
            self._touch(identity.key)
            return dataclasses.replace(existing, last_used=time.time())
        size, linked = snapshot_bytes(cache, identity.num_tokens)
        if self.max_bytes is not None and size > self.max_bytes:
            logger.warning("not saving a snapshot of %s: the store's cap is %s",
                           format_bytes(size), format_bytes(self.max_bytes))
            return None
        tier = cache.disk_tier
        if linked and (tier is None or os.stat(tier.folder).st_dev != os.stat(self.root).st_dev):
            linked = 0  # the disk tier is on another filesystem: its homes are copied, not linked
        self._evict(keep_room=size)
        self._require_free_space(size - linked)
        target = self.root / identity.key
        if target.exists():  # an unreadable or outdated snapshot under this key: replace it
            self.delete(identity.key)
        started = time.perf_counter()
        header = write_snapshot(target, cache, identity, token_ids, label=_label(label), policy=policy,
                                sidecar=sidecar)
        seconds = time.perf_counter() - started
        logger.info("saved snapshot %s: %d tokens, %.1f MB (%.1f MB of it linked from the disk tier) in %.2f s",
                    identity.key, identity.num_tokens, header.num_bytes / 1e6, linked / 1e6, seconds)
        self._evict(keep_room=0, protect=identity.key)
        return self._info(target)

    def find(self, identity: SnapshotIdentity) -> SnapshotInfo | None:
        """The snapshot saved for this model, dtype, tokenizer and document, if any.

        A damaged one is returned too (``is_readable`` False): restoring it raises ``CorruptSnapshotError``.
        """
        folder = self.root / identity.key
        return self._info(folder) if folder.is_dir() else None

    def restore(self, cache: HeadInferCache, identity: SnapshotIdentity, key: str | None = None) -> RestoreStats:
        """Fills ``cache`` from a snapshot (by default the one ``find(identity)`` returns).

        Raises ``SnapshotError`` with the reason when the snapshot is missing or made for another model,
        dtype, tokenizer or document (the cache is untouched), and ``CorruptSnapshotError`` when its files
        are damaged (the cache may be left shorter: ask it ``get_seq_length()``).
        """
        key = key or identity.key
        folder = self._folder(key)
        if not folder.is_dir():
            raise SnapshotError(f"no snapshot {key} in {self.root}")
        started = time.perf_counter()
        try:
            try:
                header = read_header(folder)
                check_compatible(header, identity, cache.shape)
                num_bytes = read_snapshot(folder, header, cache)
            except CorruptSnapshotError as error:
                # A partial read whose newest checkpoint is damaged (cut short by a kill): the one before.
                if not (folder / PREVIOUS_HEADER_FILE).exists():
                    raise
                logger.warning("snapshot %s: %s; using the checkpoint before it", key, error)
                header = read_header(folder, PREVIOUS_HEADER_FILE)
                check_compatible(header, identity, cache.shape)
                num_bytes = read_snapshot(folder, header, cache)
            seconds = time.perf_counter() - started
        except SnapshotError as error:
            raise type(error)(f"cannot restore snapshot {key}: {error}") from error
        self._touch(key)
        stats = RestoreStats(header.num_saved, num_bytes, seconds)
        logger.info("restored snapshot %s: %d tokens, %.1f MB in %.2f s (%.2f GB/s)", key, stats.num_tokens,
                    num_bytes / 1e6, seconds, stats.gb_per_second)
        return stats

    def list(self) -> list[SnapshotInfo]:
        """Every snapshot in the store, most recently used first (damaged ones too, so they can be deleted)."""
        infos = [self._info(path) for path in self._snapshot_folders()]
        return sorted(infos, key=lambda info: info.last_used, reverse=True)

    def delete(self, key: str) -> None:
        """Removes one snapshot; it stops being loadable the moment this starts."""
        folder = self._folder(key)
        trash = self.root / f"{_TRASH_PREFIX}{key}-{os.getpid()}-{time.monotonic_ns()}"
        try:
            os.rename(folder, trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)
        logger.info("deleted snapshot %s", key)

    def evict_for(self, num_bytes: int, protect: str | None = None) -> None:
        """Makes room for ``num_bytes`` more under the cap by evicting least recently used snapshots, never
        ``protect`` (a read checkpointing into the store)."""
        self._evict(keep_room=num_bytes, protect=protect)

    def total_bytes(self) -> int:
        """Bytes the snapshots take together."""
        return sum(_folder_bytes(path) for path in self._snapshot_folders())

    # -- helpers ---------------------------------------------------------------------------------
    def _folder(self, key: str) -> Path:
        if not _KEY.match(key):
            raise InputError(f"not a snapshot key: {key!r}")
        return self.root / key

    def _snapshot_folders(self) -> list[Path]:
        return [p for p in self.root.iterdir() if p.is_dir() and _KEY.match(p.name)]

    def _readable_info(self, key: str) -> SnapshotInfo | None:
        folder = self._folder(key)
        if not folder.is_dir():
            return None
        info = self._info(folder)
        return info if info.is_readable else None

    def _info(self, folder: Path) -> SnapshotInfo:
        last_used = _mtime(folder / LAST_USED_FILE) or _mtime(folder)
        try:
            header: SnapshotHeader = read_header(folder)
        except SnapshotError:
            try:  # a partial read's newest header is never missing, but may be damaged: its previous one
                header = read_header(folder, PREVIOUS_HEADER_FILE)
            except SnapshotError:
                return SnapshotInfo(folder.name, "(damaged snapshot)", 0, _folder_bytes(folder), _mtime(folder),
                                    last_used, "", "", folder, is_readable=False)
        return SnapshotInfo(folder.name, header.label, header.identity.num_tokens, _folder_bytes(folder),
                            header.created, last_used, header.identity.model.name, header.identity.dtype, folder,
                            num_read=header.num_read, read_seconds=header.read_seconds)

    def _touch(self, key: str) -> None:
        try:
            (self.root / key / LAST_USED_FILE).touch()
        except OSError as error:  # a read-only store still restores; eviction order just goes stale
            logger.warning("could not mark snapshot %s as used: %s", key, error)

    def _evict(self, keep_room: int, protect: str | None = None) -> None:
        """Deletes least recently used snapshots until they take at most ``max_bytes - keep_room``."""
        if self.max_bytes is None:
            return
        infos = sorted(self.list(), key=lambda info: info.last_used)
        total = sum(info.num_bytes for info in infos)
        for info in infos:
            if total + keep_room <= self.max_bytes:
                break
            if info.key == protect:
                continue
            logger.info("evicting snapshot %s (%.1f MB, %r) to stay under the store's cap", info.key,
                        info.num_bytes / 1e6, info.label)
            self.delete(info.key)
            total -= info.num_bytes

    def _require_free_space(self, size: int) -> None:
        free = shutil.disk_usage(self.root).free
        if free < size + (64 << 20):
            raise OSError(errno.ENOSPC, f"not enough free disk space for a {format_bytes(size)} snapshot "
                                        f"({format_bytes(free)} free in {self.root})")

    def _remove_stale_temporaries(self) -> None:
        now = time.time()
        for path in self.root.iterdir():
            if path.name.startswith((TEMP_PREFIX, _TRASH_PREFIX)) and now - _mtime(path) > _STALE_SECONDS:
                logger.info("removing %s left by an interrupted save or delete", path)
                shutil.rmtree(path, ignore_errors=True)


def _label(text: str) -> str:
    words = " ".join(text.split())
    return words if len(words) <= _LABEL_CHARS else words[: _LABEL_CHARS - 1] + "…"


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _folder_bytes(folder: Path) -> int:
    """Bytes in a snapshot folder; one deleted meanwhile (another tab, eviction) counts as empty."""
    total = 0
    try:
        paths = list(folder.iterdir())
    except OSError:
        return 0
    for path in paths:
        try:
            total += path.stat().st_size
        except OSError:
            pass
    return total
