"""Streaming contiguous KV runs to and from files, checksummed as they pass.

A *run* is one contiguous tensor (one KV head's tokens for one batch row). Host runs are written from
and read into their own memory through a uint8 view, so a restore lands in the home tensors with no
extra copy; runs on a CUDA device pass through two reusable pinned staging buffers. The CRC-32 of each
file is computed on one worker thread while the caller's thread does the next read or write (both
release the GIL), so checksumming costs no time when the disk is the slower of the two.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

PIECE_BYTES = 16 << 20  # one read/write call and one checksum step: small enough to overlap the two


class ChecksumMismatch(Exception):
    """A file's bytes do not hash to the expected CRC-32."""


class TruncatedFile(Exception):
    """A file ended before the bytes it should hold."""


class _Checksum:
    """CRC-32 of a stream of pieces, updated in order on one worker thread."""

    def __init__(self, worker: ThreadPoolExecutor):
        self._worker = worker
        self._value = 0
        self._last: Future | None = None

    def update(self, piece: memoryview) -> Future:
        # A single worker runs tasks in submission order, so the chained CRC sees the pieces in file order.
        self._last = self._worker.submit(self._step, piece)
        return self._last

    def _step(self, piece: memoryview) -> None:
        self._value = zlib.crc32(piece, self._value)

    def value(self) -> int:
        if self._last is not None:
            self._last.result()
        return self._value


class _Staging:
    """Two pinned host buffers that device runs pass through; a buffer is reused once its last use ended."""

    def __init__(self):
        self._buffers = [torch.empty(PIECE_BYTES, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        self._busy: list[tuple] = [(), ()]
        self._next = 0

    def acquire(self) -> tuple[int, torch.Tensor]:
        index = self._next
        self._next ^= 1
        _wait(self._busy[index])
        return index, self._buffers[index]

    def release(self, index: int, *pending) -> None:
        self._busy[index] = pending

    def drain(self) -> None:
        for pending in self._busy:
            _wait(pending)
        self._busy = [(), ()]


class RunStreamer:
    """Writes and reads files made of runs; owns the checksum worker and the staging buffers."""

    def __init__(self):
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-checksum")
        self._staging: _Staging | None = None

    def close(self) -> None:
        if self._staging is not None:
            self._staging.drain()
        self._worker.shutdown(wait=True)

    def __enter__(self) -> RunStreamer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def write_file(self, path: Path, runs: Sequence[torch.Tensor]) -> tuple[int, int]:
        """Writes the runs back to back into a new file at ``path`` and fsyncs it. Returns (bytes, crc32)."""
        checksum = _Checksum(self._worker)
        with open(path, "xb", buffering=0) as file:
            def consume(piece: memoryview) -> Future:
                done = checksum.update(piece)  # hashed on the worker while this thread writes the same bytes
                _write_all(file, piece)
                return done

            for run in runs:
                self._each_piece(run, consume, into_run=False)
            os.fsync(file.fileno())
        return sum(run.nbytes for run in runs), checksum.value()

    def read_file(self, path: Path, runs: Sequence[torch.Tensor], expected_crc32: int) -> int:
        """Fills the runs from ``path`` in order and checks the file's CRC-32. Returns the bytes read.

        Raises ``TruncatedFile`` or ``ChecksumMismatch``; the runs then hold partial data.
        """
        checksum = _Checksum(self._worker)
        with open(path, "rb", buffering=0) as file:
            if hasattr(os, "posix_fadvise"):  # a larger read-ahead window for one front-to-back pass
                os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)

            def consume(piece: memoryview) -> Future:
                _readinto_all(file, piece)
                return checksum.update(piece)  # hashed on the worker while this thread reads the next piece

            for run in runs:
                self._each_piece(run, consume, into_run=True)
            if file.read(1):
                raise TruncatedFile(f"{path.name} is longer than its header says")
        if self._staging is not None:
            self._staging.drain()  # device copies have landed before the caller uses the homes
        if checksum.value() != expected_crc32:
            raise ChecksumMismatch(f"{path.name} does not match its checksum")
        return sum(run.nbytes for run in runs)

    def _each_piece(self, run: torch.Tensor, consume: Callable[[memoryview], Future], *, into_run: bool) -> None:
        """Calls ``consume(host bytes) -> checksum future`` for each piece of ``run``, in order.

        into_run: ``consume`` fills the piece (a read) and a device run receives it afterwards; otherwise
        the piece holds the run's bytes (a write). Host runs are consumed in place, with no copy.
        """
        # run: [tokens, D] for one (head, batch row), contiguous
        assert run.is_contiguous(), "a run must be one contiguous tensor"
        flat = run.reshape(-1).view(torch.uint8)
        if flat.device.type == "cpu":
            host = memoryview(flat.numpy())
            for start in range(0, len(host), PIECE_BYTES):
                consume(host[start : start + PIECE_BYTES])
            return
        staging = self._staging = self._staging or _Staging()
        for start in range(0, flat.numel(), PIECE_BYTES):
            device_piece = flat[start : start + PIECE_BYTES]
            index, buffer = staging.acquire()
            host_piece = buffer[: device_piece.numel()]
            if not into_run:
                host_piece.copy_(device_piece)  # synchronous: the bytes are on the host when it returns
            pending = [consume(memoryview(host_piece.numpy()))]
            if into_run:
                device_piece.copy_(host_piece, non_blocking=True)
                pending.append(torch.cuda.current_stream(flat.device).record_event())
            # The buffer is free again once its checksum and its device copy have finished.
            staging.release(index, *pending)


def _wait(pending) -> None:
    for item in pending:
        if isinstance(item, Future):
            item.result()
        else:
            item.synchronize()  # a CUDA event


def _write_all(file, view: memoryview) -> None:
    """Writes all of ``view``; a regular file may take a large write in several calls."""
    while len(view):
        written = file.write(view)
        view = view[written:]


def _readinto_all(file, view: memoryview) -> None:
    """Fills all of ``view`` from ``file``; raises ``TruncatedFile`` at a premature end."""
    while len(view):
        read = file.readinto(view)
        if not read:
            raise TruncatedFile(f"{Path(file.name).name} ended early")
        view = view[read:]


def fsync_directory(path: Path) -> None:
    """Makes a rename or a new entry in ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
