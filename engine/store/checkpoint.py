"""Checkpointing a read in progress to the snapshot store, so that a crash or a restart loses little of it.

A checkpoint at ``num_read`` tokens adds, per layer, one part file with the tokens read since the last one (a
sliding-window layer: its whole window, the only part it keeps), then rewrites the header atomically, the one
before kept as ``header-previous.json`` (``format.py``). The caller's thread only waits for the cache's copies
in flight and takes views of the new rows (copies of ring windows and of device-resident rows, which later
chunks overwrite or which a thread cannot read); the files are written on a background thread, one checkpoint
at a time: a checkpoint due while the previous one is still writing is skipped, never waited for.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..errors import CorruptSnapshotError, InputError, SnapshotError
from ..interrupt import begin_work, end_work, stopping
from ..cache import HeadInferCache
from .fingerprint import token_ids_bytes
from .files import TEMP_PREFIX, check_sidecar_name, saved_range, write_atomically
from .format import (
    HEADER_FILE,
    LAST_USED_FILE,
    PARTIAL_VERSION,
    PREVIOUS_HEADER_FILE,
    TOKENS_FILE,
    FileEntry,
    SnapshotHeader,
    SnapshotIdentity,
    part_file,
    read_header,
    shape_fields,
)
from .streaming import SpanStreamer, fsync_directory

if TYPE_CHECKING:
    from .snapshots import SnapshotStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointPlan:
    """Where and how often a read is checkpointed: every ``every_seconds`` or ``every_chunks`` forwards, whichever
    comes first. ``sidecar``: (file name, text) pairs written beside the K/V at the first checkpoint (the app's
    shelf entry), so that a partial read reopens like a saved one."""

    store: SnapshotStore
    every_seconds: float = 120.0
    every_chunks: int = 16
    label: str = ""
    sidecar: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        if self.every_seconds <= 0 or self.every_chunks < 1:
            raise InputError(f"checkpoint every {self.every_seconds} s / {self.every_chunks} chunks: both must be > 0")
        for name, _ in self.sidecar:
            check_sidecar_name(name)


_LABEL_CHARS = 80  # as a saved snapshot's (``snapshots.py``)
# The folders a read of this process is checkpointing into. Two tabs reading the same document (the same identity,
# the same folder) would otherwise interleave: the second, finding the first's partial read, deleted it as a stale
# one while the first went on writing parts its header then listed. The second read goes on without checkpoints.
_CLAIMED: set[Path] = set()
_CLAIMED_LOCK = threading.Lock()
_Job = list[tuple[int, int, int, list[torch.Tensor]]]  # per layer: (layer index, start, stop, its spans in file order)


class ReadCheckpoints:
    """Writes the checkpoints of one read of ``identity``'s document into ``plan.store`` (see the module doc).

    ``num_read``: the tokens the cache holds now (a read continued from a partial snapshot: the tokens that
    snapshot restored, whose parts are kept and extended)."""

    def __init__(self, plan: CheckpointPlan, cache: HeadInferCache, token_ids: list[int], identity: SnapshotIdentity,
                 num_read: int, policy: dict | None = None):
        self.plan, self.cache, self.identity, self.policy = plan, cache, identity, policy or {}
        self._token_ids = token_ids
        self.folder = plan.store.root / identity.key
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-checkpoint")
        self._pending: Future | None = None
        self.num_written = 0  # checkpoints that landed
        with _CLAIMED_LOCK:
            self._claimed = self.folder not in _CLAIMED
            _CLAIMED.add(self.folder)
        if self._claimed:
            begin_work()  # a Ctrl+C waits for this read's checkpoints until ``close`` (``interrupt.stop_on_ctrl_c``)
        # Over the store's cap, the disk failed, or another read of this process checkpoints this document: the
        # read goes on without checkpoints.
        self.is_stopped = not self._claimed
        if not self._claimed:
            logger.info("another read is checkpointing this document (%s); this one goes on without checkpoints",
                        identity.key)
            self._header, self._done, self._seconds_before = None, 0, 0.0
            return
        self._header = self._continued(num_read)
        self._done = self._header.num_read if self._header is not None else 0
        self._seconds_before = self._header.read_seconds if self._header is not None else 0.0  # earlier sittings' reading
        if self._header is None and self.folder.exists():
            try:
                self.is_stopped = read_header(self.folder).num_read is None  # a complete one is kept as it is
            except SnapshotError:
                pass
            if not self.is_stopped:  # another partial read of this document, or a damaged one: this read replaces it
                plan.store.delete(identity.key)

    def _continued(self, num_read: int) -> SnapshotHeader | None:
        """The partial snapshot this read continues (the header that restored ``num_read`` tokens), if any."""
        if num_read == 0:
            return None
        for name in (HEADER_FILE, PREVIOUS_HEADER_FILE):
            try:
                header = read_header(self.folder, name)
            except SnapshotError:
                continue
            if header.num_read == num_read and header.identity == self.identity:
                if name != HEADER_FILE:  # the newest was damaged: the one restored becomes the newest again
                    write_atomically(self.folder / HEADER_FILE, header.to_json().encode())
                return header
        return None

    # -- the reader's thread -----------------------------------------------------------------------
    def checkpoint(self, num_read: int, seconds: float = 0.0) -> bool:
        """Starts a checkpoint of the cache's first ``num_read`` tokens, read in ``seconds`` by this ``prefill``;
        False when skipped (the previous one still writing, nothing new, or checkpoints stopped)."""
        if self.is_stopped or num_read <= self._done or (self._pending is not None and not self._pending.done()):
            return False
        self._collect()
        self.cache.synchronize()  # the rows below num_read have landed in their homes
        job = [(layer.layer_idx, *self._range(layer.window, num_read), self._spans(layer.homes, layer.window, num_read))
               for layer in self.cache.kv_layers]
        # (never below 0: the header check counts a negative time as damage; a read that gave way can report one)
        self._pending = self._worker.submit(self._write, job, num_read, max(0.0, self._seconds_before + seconds))
        self._done = num_read
        return True

    def close(self, num_read: int | None = None, seconds: float = 0.0) -> None:
        """Waits for the checkpoint being written (if any), stops the worker and lets another read checkpoint this
        document. After a Ctrl+C (``interrupt.stopping``) the first ``num_read`` tokens, read in ``seconds``, are
        checkpointed first: what was read since the last checkpoint is kept."""
        try:
            if num_read is not None and stopping() and num_read < self.identity.num_tokens:
                self._collect()
                self.checkpoint(num_read, seconds)
            self._collect()
            self._worker.shutdown(wait=True)
        finally:
            if self._claimed:
                with _CLAIMED_LOCK:
                    _CLAIMED.discard(self.folder)
                self._claimed = False
                end_work()

    def _collect(self) -> None:
        if self._pending is not None:
            try:
                self._pending.result()
            except (OSError, SnapshotError) as error:
                logger.warning("stopped checkpointing this read: %s", error)
                self.is_stopped = True
            self._pending = None

    def _range(self, window: int | None, num_read: int) -> tuple[int, int]:
        return saved_range(window, num_read) if window is not None else (self._done, num_read)

    def _spans(self, homes, window: int | None, num_read: int) -> list[torch.Tensor]:
        """The layer's new rows per group and plane, in file order: views of host rows later chunks never touch,
        copies of ring rows (overwritten as the read goes on) and of rows on the compute device."""
        start, stop = self._range(window, num_read)
        spans = []
        for home in homes:
            for plane in range(len(home.planes)):
                for span in home.spans(start, stop, plane):
                    copy = window is not None or span.device.type != "cpu"
                    spans.append(span.to("cpu", copy=True) if copy else span)  # [n, B, 2, g, D] or its scales
        return spans

    # -- the worker thread -------------------------------------------------------------------------
    def _write(self, job: _Job, num_read: int, read_seconds: float) -> None:
        store = self.plan.store
        new_bytes = sum(span.nbytes for _, _, _, spans in job for span in spans)
        if store.max_bytes is not None:
            if new_bytes + _folder_bytes(self.folder) > store.max_bytes:
                raise SnapshotError(f"the partial read would take more than the store's cap ({store.max_bytes:,} B)")
            store.evict_for(new_bytes, protect=self.identity.key)
        started = time.perf_counter()
        fresh = self._header is None
        folder = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{self.folder.name}-", dir=store.root)) if fresh \
            else self.folder
        try:
            with SpanStreamer() as streamer:
                files = list(self._header.files) if not fresh else []
                if fresh:
                    ids = torch.frombuffer(bytearray(token_ids_bytes(self._token_ids)), dtype=torch.uint8)
                    files.append(FileEntry(TOKENS_FILE, *streamer.write_file(folder / TOKENS_FILE, [ids])))
                    for name, text in self.plan.sidecar:
                        write_atomically(folder / name, text.encode())
                windowed = {layer.layer_idx for layer in self.cache.kv_layers if layer.window is not None}
                files = [f for f in files if not (f.is_part and f.layer in windowed)]  # a ring keeps its newest
                for layer_idx, start, stop, spans in job:
                    name = part_file(layer_idx, start, stop)
                    _remove(folder / name)  # a part a kill cut short, never listed
                    files.append(FileEntry(name, *streamer.write_file(folder / name, spans), layer=layer_idx,
                                           start=start, stop=stop))
            header = self._new_header(files, num_read, read_seconds)
            if fresh:
                write_atomically(folder / HEADER_FILE, header.to_json().encode())
                (folder / LAST_USED_FILE).touch()
                fsync_directory(folder)
                os.rename(folder, self.folder)
                fsync_directory(store.root)
            else:
                write_atomically(self.folder / PREVIOUS_HEADER_FILE, (self.folder / HEADER_FILE).read_bytes())
                write_atomically(self.folder / HEADER_FILE, header.to_json().encode())
                self._remove_unlisted(header)
                (self.folder / LAST_USED_FILE).touch()
        finally:
            if fresh:
                shutil.rmtree(folder, ignore_errors=True)  # no-op after the rename
        self._header = header
        self.num_written += 1
        logger.info("checkpointed the read at %d of %d tokens (%.1f MB new) in %.2f s", num_read,
                    self.identity.num_tokens, new_bytes / 1e6, time.perf_counter() - started)

    def _new_header(self, files: list[FileEntry], num_read: int, read_seconds: float) -> SnapshotHeader:
        files = sorted(files, key=lambda f: (not f.is_part, f.layer or 0, f.start or 0))
        created = self._header.created if self._header is not None else time.time()
        label = " ".join(self.plan.label.split())
        label = label if len(label) <= _LABEL_CHARS else label[: _LABEL_CHARS - 1] + "…"
        return SnapshotHeader(self.identity, label, created, files=tuple(files), policy=self.policy,
                              kv_dtype=self.cache.policy.kv_dtype, num_read=num_read, read_seconds=read_seconds,
                              **shape_fields(self.cache, PARTIAL_VERSION))

    def _remove_unlisted(self, header: SnapshotHeader) -> None:
        """Deletes the part files neither the newest nor the previous header lists (replaced windows, cut-short
        parts)."""
        try:
            listed = {f.name for f in header.files} | {f.name for f in read_header(self.folder, PREVIOUS_HEADER_FILE).files}
        except CorruptSnapshotError:
            listed = {f.name for f in header.files}
        for path in self.folder.glob("layer-*-part-*.bin"):
            if path.name not in listed:
                _remove(path)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _folder_bytes(folder: Path) -> int:
    try:
        return sum(p.stat().st_size for p in folder.iterdir())
    except OSError:
        return 0
