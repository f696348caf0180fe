"""Streaming contiguous KV spans to and from files, checksummed as they pass.

A *span* is one contiguous tensor (a home plane's tokens, ``GroupHome.spans``, or the token ids). Host spans are
written from and read into their own memory through a uint8 view, so a restore lands in the home tensors with no
extra copy; spans on a CUDA device pass through two reusable pinned staging buffers. Two helper threads keep the
reader at disk speed: one computes each file's CRC-32 while the caller reads or writes the
next piece, one maps in fresh host pages ahead of the reader (all three release the GIL).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from ..errors import ChecksumMismatch, TruncatedFile
from ..kv.checksum import crc32 as _crc32
from ..kv.streams import SyncStreams

logger = logging.getLogger(__name__)

PIECE_BYTES = 16 << 20  # one read/write call and one checksum step: small enough to overlap the two
_MADV_POPULATE_WRITE = 23  # linux/mman.h; Linux 5.14+


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # ctypes releases the GIL during the call
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


_LIBC = _libc()


class _Checksum:
    """CRC-32 of a stream of pieces, updated in order on one worker thread."""

    def __init__(self, worker: ThreadPoolExecutor):
        self._worker = worker
        self._value = 0
        self._steps: list[Future] = []

    def update(self, piece: memoryview) -> Future:
        # A single worker runs tasks in submission order, so the chained CRC sees the pieces in file order.
        self._steps.append(self._worker.submit(self._step, piece))
        return self._steps[-1]

    def _step(self, piece: memoryview) -> None:
        self._value = _crc32(piece, self._value)

    def value(self) -> int:
        for step in self._steps:
            step.result()  # re-raises a failed step rather than returning a wrong checksum
        return self._value


class _Staging:
    """Two pinned host buffers that device spans pass through; a buffer is reused once its last use ended (its
    checksum step and its copy on the compute stream, a blocking event of the cache's streams seam)."""

    def __init__(self, streams):
        self._buffers = [streams.pinned((PIECE_BYTES,), torch.uint8) for _ in range(2)]
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


class _Prefaulter:
    """Maps in the pages of host spans ahead of the reader, on their own threads.

    Fresh host memory costs a page fault per 4 KiB at first touch, inside the read, serialised with the
    disk; on a VM that returns freed memory to its host each fault is a trip to the host, and a cold
    restore ran well below the disk's speed. ``MADV_POPULATE_WRITE`` (Linux 5.14+) maps pages without
    touching their contents, so it may race the reader harmlessly; two threads interleave spans in the
    reader's order (docs/benchmarks/snapshot-cpu.md, Notes from the code).
    """

    def __init__(self, spans: Sequence[torch.Tensor], num_threads: int = 2):
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(list(spans[i::num_threads]),),
                                          name=f"kv-prefault-{i}", daemon=True) for i in range(num_threads)]
        for thread in self._threads:
            thread.start()

    def _run(self, spans: list[torch.Tensor]) -> None:
        for span in spans:
            if self._stop.is_set() or not _populate(span):
                return

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def _populate(span: torch.Tensor) -> bool:
    """Populates the whole pages inside ``span``'s bytes; False where the kernel cannot."""
    start = -(-span.data_ptr() // mmap.PAGESIZE) * mmap.PAGESIZE
    stop = (span.data_ptr() + span.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if stop <= start:
        return True
    return _LIBC.madvise(start, stop - start, _MADV_POPULATE_WRITE) == 0


class SpanStreamer:
    """Writes and reads files made of spans; owns the checksum worker and the staging buffers.

    ``streams``: the cache's streams seam (``kv/streams.py``), through which every copy between a device span and
    the staging buffers goes and every wait on one is ordered (default: synchronous). ``device_spans``: the ids of
    the spans that live on the compute device although they are CPU tensors (resident homes under emulated
    streams), so that they take the same staged path as on a GPU and the checker sees its waits.
    """

    def __init__(self, streams=None, device_spans: frozenset[int] = frozenset()):
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-checksum")
        self._streams = streams or SyncStreams()
        self._device_spans = device_spans
        self._staging: _Staging | None = None
        self._prefaulter: _Prefaulter | None = None

    def prefault(self, spans: Sequence[torch.Tensor]) -> None:
        """Starts mapping in the pages of the host spans that ``read_file`` calls will fill, in that order."""
        host = [span for span in spans if span.device.type == "cpu" and not span.is_pinned()]
        if _LIBC is not None and host:
            self._prefaulter = _Prefaulter(host)

    def close(self) -> None:
        if self._prefaulter is not None:
            self._prefaulter.stop()
        if self._staging is not None:
            self._staging.drain()
        self._worker.shutdown(wait=True)

    def __enter__(self) -> SpanStreamer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def write_file(self, path: Path, spans: Sequence[torch.Tensor]) -> tuple[int, int]:
        """Writes the spans back to back into a new file at ``path`` and fsyncs it. Returns (bytes, crc32)."""
        checksum = _Checksum(self._worker)
        with open(path, "xb", buffering=0) as file:
            def consume(piece: memoryview) -> Future:
                done = checksum.update(piece)  # hashed on the worker while this thread writes the same bytes
                _write_all(file, piece)
                return done

            for span in spans:
                self._each_piece(span, consume, into_span=False)
            os.fsync(file.fileno())
            _drop_cached(file)
        return sum(span.nbytes for span in spans), checksum.value()

    def read_file(self, path: Path, spans: Sequence[torch.Tensor], expected_crc32: int, *, whole: bool = True) -> int:
        """Fills the spans from ``path`` in order and checks their CRC-32. Returns the bytes read.

        whole: the spans must be the whole file (otherwise its first bytes: a home file may be longer).
        Raises ``TruncatedFile`` or ``ChecksumMismatch``; the spans then hold partial data.
        """
        checksum = _Checksum(self._worker)
        with open(path, "rb", buffering=0) as file:
            if hasattr(os, "posix_fadvise"):  # a larger read-ahead window for one front-to-back pass
                os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)

            def consume(piece: memoryview) -> Future:
                _readinto_all(file, piece)
                return checksum.update(piece)  # hashed on the worker while this thread reads the next piece

            for span in spans:
                self._each_piece(span, consume, into_span=True)
            if whole and file.read(1):
                raise TruncatedFile(f"{path.name} is longer than its header says")
            _drop_cached(file)
        if self._staging is not None:
            self._staging.drain()  # device copies have landed before the caller uses the homes
        if checksum.value() != expected_crc32:
            raise ChecksumMismatch(f"{path.name} does not match its checksum")
        return sum(span.nbytes for span in spans)

    def _each_piece(self, span: torch.Tensor, consume: Callable[[memoryview], Future], *, into_span: bool) -> None:
        """Calls ``consume(host bytes) -> checksum future`` for each piece of ``span``, in order.

        into_span: ``consume`` fills the piece (a read) and a device span receives it afterwards; otherwise
        the piece holds the span's bytes (a write). Host spans are consumed in place, with no copy.
        """
        # span: [n, B, 2, g, D] (or its scales, or the token ids' bytes), contiguous
        assert span.is_contiguous(), "a span must be one contiguous tensor"
        flat = span.reshape(-1).view(torch.uint8)
        if flat.device.type == "cpu" and id(span) not in self._device_spans:
            host = memoryview(flat.numpy())
            for start in range(0, len(host), PIECE_BYTES):
                consume(host[start : start + PIECE_BYTES])
            return
        streams = self._streams
        staging = self._staging = self._staging or _Staging(streams)
        for start in range(0, flat.numel(), PIECE_BYTES):
            device_piece = flat[start : start + PIECE_BYTES]
            index, buffer = staging.acquire()
            host_piece = buffer[: device_piece.numel()]
            if not into_span:
                streams.copy(host_piece, device_piece, "a snapshot save's device -> staging copy")
                landed = streams.event(blocking=True)
                landed.record(streams.current())
                landed.synchronize()  # the bytes are on the host before this thread writes and hashes them
                streams.host_read(host_piece, "a snapshot save writing and hashing a staged piece")
            else:
                streams.host_write(host_piece, "a snapshot restore reading a piece into staging")
            pending = [consume(memoryview(host_piece.numpy()))]
            if into_span:
                streams.copy(device_piece, host_piece, "a snapshot restore's staging -> device copy")
                copied = streams.event(blocking=True)
                copied.record(streams.current())
                pending.append(copied)
            # The buffer is free again once its checksum and its device copy have finished.
            staging.release(index, *pending)


def _drop_cached(file) -> None:
    """Frees the file's pages from the page cache once its bytes live in the homes (or on disk).

    A snapshot is read once: keeping a second copy cached would evict more useful pages, and on a VM the
    freed pages are the cheapest ones for the next file's read-ahead to reuse.
    """
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _wait(pending) -> None:
    for item in pending:
        if isinstance(item, Future):
            item.result()
        else:
            item.synchronize()  # an event of the streams seam (blocking: the thread sleeps)


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
