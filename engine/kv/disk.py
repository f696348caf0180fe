"""The disk tier: homes in files, for the part of a plan beyond host RAM (exact, only slower).

Each disk home plane is one file, mapped into the address space (``mmap``) and seen as a tensor
``[capacity, ...]``, token-major like every home: fetches read it like any host home (page faults become disk
reads) and appends write it (the kernel writes the dirty pages back). Space is reserved with
``posix_fallocate`` when a file is made, so a full disk is a clear ``OSError`` up front, never a crash on a
later write into a sparse file. ``read_ahead`` asks the kernel to start reading a range the schedule will
fetch next (``MADV_WILLNEED``). Files live in a fresh folder under ``disk_dir`` and are deleted on ``close``.

A home file's first ``n`` rows are byte for byte a snapshot's run of that home (``snapshot_format.py``), so a
document read through the disk tier is saved by *linking* its files into the snapshot (``link``), not by
copying them. Two things make that cheap and safe:

- a running CRC-32 per file, extended as appends write rows in order (``note_written``) with a checkpoint at
  every append boundary, so the snapshot's checksum of the first ``n`` rows is usually known already;
- *sealing*: once rows ``[0, n)`` are linked into a snapshot they are never written again. Rows past ``n``
  (questions and answers) may change: a snapshot covers only its prefix. A crop below ``n`` (a new document)
  moves the home to a fresh file first (``LayerHomes.crop_to``), and when a file is closed its snapshot links
  are trimmed to their prefix.
"""

from __future__ import annotations

import bisect
import errno
import logging
import mmap
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import DiskTierError
from ..paths_windows import windows_rules
from .checksum import crc32

logger = logging.getLogger(__name__)

_PIECE_BYTES = 16 << 20  # checksum step when a prefix's CRC is computed from the file
# Errors of os.link that mean "not here" (another filesystem, no hard links): the caller copies instead.
_CANNOT_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EACCES}


@dataclass
class _File:
    mapping: mmap.mmap
    path: Path
    row_bytes: int
    fd: int  # kept open for ``read_into``: reads see the mapping's own pages (one page cache)
    crcs: dict[int, int] = field(default_factory=lambda: {0: 0})  # rows r -> CRC-32 of rows [0, r)
    links: list[tuple[Path, int, int]] = field(default_factory=list)  # (snapshot file, inode, bytes it keeps)

    @property
    def sealed_rows(self) -> int:
        return max((num_bytes // self.row_bytes for _, _, num_bytes in self.links), default=0)


class DiskMemory:
    """Makes file-backed tensors under ``folder``; ``close`` unmaps and deletes them."""

    def __init__(self, folder: str | os.PathLike):
        root = Path(folder).expanduser()
        try:
            root.mkdir(parents=True, exist_ok=True)
            self.folder = Path(tempfile.mkdtemp(prefix="kv-", dir=root))
        except OSError as error:
            raise DiskTierError(f"cannot use {root} for the KV disk tier: {error.strerror or error}") from error
        self._files: dict[int, _File] = {}  # data_ptr of a file's tensor -> the file
        self._bases: list[int] = []  # sorted keys of _files, to find the file a view points into
        self._count = 0
        self.num_reads = 0  # read_into calls (preadv)
        self._finalizer = weakref.finalize(self, _remove, self._files, self.folder)

    @property
    def nbytes(self) -> int:
        return sum(f.mapping.size() for f in self._files.values())

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A new file-backed tensor ``[rows, ...]``, its space reserved on disk."""
        num_bytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        path = self.folder / f"home-{self._count:05d}.kv"
        self._count += 1
        fd = -1
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            _reserve(fd, max(num_bytes, 1), self.folder)  # real blocks now: ENOSPC here, not SIGBUS later
            mapping = mmap.mmap(fd, max(num_bytes, 1))
        except OSError as error:
            if fd >= 0:
                os.close(fd)
            path.unlink(missing_ok=True)
            free = shutil.disk_usage(self.folder).free if self.folder.exists() else 0
            raise DiskTierError(f"cannot make a {num_bytes / 2**30:.2f} GiB KV file in {self.folder} "
                                f"({error.strerror or error}; {free / 2**30:.1f} GiB free)") from error
        with torch.inference_mode(False):
            tensor = torch.frombuffer(mapping, dtype=torch.uint8, count=num_bytes).view(dtype).view(shape)
        row_bytes = num_bytes // shape[0] if shape[0] else max(num_bytes, 1)
        self._files[tensor.data_ptr()] = _File(mapping, path, row_bytes, fd)
        bisect.insort(self._bases, tensor.data_ptr())
        return tensor

    def _find(self, tensor: torch.Tensor) -> tuple[_File, int] | None:
        """(the file ``tensor`` views, the byte offset of its first element), or None if it is no disk home."""
        index = bisect.bisect_right(self._bases, tensor.data_ptr()) - 1
        if index < 0:
            return None
        base = self._bases[index]
        file, offset = self._files[base], tensor.data_ptr() - base
        return (file, offset) if offset < file.mapping.size() else None

    def read_ahead(self, tensor: torch.Tensor) -> None:
        """Asks the kernel to read the pages of ``tensor`` (a view into a disk home) in the background."""
        found = self._find(tensor)
        if found is None:
            return
        file, offset = found
        start = offset - offset % mmap.PAGESIZE
        length = min(file.mapping.size() - start, tensor.nbytes + offset - start)
        try:
            file.mapping.madvise(mmap.MADV_WILLNEED, start, length)
        except (OSError, ValueError, AttributeError):  # advice only: never fail a fetch over it
            pass

    def read_into(self, rows: torch.Tensor, target: torch.Tensor) -> bool:
        """Reads ``rows`` (a contiguous view into a disk home) into ``target`` (contiguous host memory of the same
        size) with ``preadv``: large sequential reads run at the disk's speed, where faulting the mapping's pages
        in one by one does not. False if ``rows`` is not in a disk home (the caller copies instead)."""
        found = self._find(rows)
        if found is None or not target.is_contiguous() or target.nbytes != rows.nbytes:
            return False
        file, offset = found
        self.num_reads += 1
        view = memoryview(target.view(torch.uint8).reshape(-1).numpy()) if target.nbytes else memoryview(b"")
        while len(view):
            read = os.preadv(file.fd, [view], offset)
            if read <= 0:
                raise DiskTierError(f"{file.path} ended early (a KV file was truncated)")
            view, offset = view[read:], offset + read
        return True

    # -- the running checksum --------------------------------------------------------------------------
    def note_written(self, rows: torch.Tensor) -> None:
        """Records that ``rows`` (a view of consecutive rows of a home file) now hold new bytes.

        Appends in order extend the file's CRC chain (one checkpoint per append); a write below the chain's end
        drops the checkpoints it invalidates, and a write past a gap leaves the chain where it was.
        """
        found = self._find(rows)
        if found is None:
            return
        file, offset = found
        first, num = offset // file.row_bytes, rows.shape[0]
        for row in [r for r in file.crcs if r > first]:
            del file.crcs[row]
        if first in file.crcs and num:
            view = memoryview(file.mapping)[offset : offset + num * file.row_bytes]
            try:
                file.crcs[first + num] = crc32(view, file.crcs[first])
            finally:
                view.release()

    def forget_written(self, plane: torch.Tensor, rows: int) -> None:
        """Drops the checkpoints past ``rows`` of a home file (its rows from there on were written behind
        ``note_written``'s back, e.g. read in from a snapshot)."""
        found = self._find(plane)
        if found is not None:
            file = found[0]
            file.crcs = {r: c for r, c in file.crcs.items() if r <= rows}

    def prefix_crc(self, plane: torch.Tensor, rows: int) -> int:
        """CRC-32 of the first ``rows`` rows of a home file: from the chain, reading only what it lacks."""
        file, _ = self._require(plane)
        start = max(r for r in file.crcs if r <= rows)
        value = file.crcs[start]
        if start < rows:
            view = memoryview(file.mapping)
            try:
                for begin in range(start * file.row_bytes, rows * file.row_bytes, _PIECE_BYTES):
                    value = crc32(view[begin : min(begin + _PIECE_BYTES, rows * file.row_bytes)], value)
            finally:
                view.release()
            file.crcs[rows] = value
        return value

    # -- snapshots: linking and sealing ----------------------------------------------------------------
    def link(self, plane: torch.Tensor, target: Path) -> bool:
        """Hard-links the home file of ``plane`` as ``target`` after writing its dirty pages back; False where
        the filesystem cannot (another filesystem than ``target``'s, no hard links): copy instead."""
        file, _ = self._require(plane)
        file.mapping.flush()  # msync: the snapshot is durable once its folder is
        if windows_rules():  # a mapped file can be neither deleted nor renamed on NTFS: the snapshot takes a copy
            logger.info("no hard links under Windows' rules: copying %s into %s", file.path.name, target.parent)
            return False
        try:
            os.link(file.path, target)
        except OSError as error:
            if error.errno in _CANNOT_LINK:
                logger.info("cannot link %s into %s (%s): copying it", file.path, target.parent, error.strerror)
                return False
            raise
        return True

    def seal(self, plane: torch.Tensor, rows: int, snapshot_file: Path) -> None:
        """Marks rows ``[0, rows)`` of a home file as held by ``snapshot_file`` (a link of it)."""
        file, _ = self._require(plane)
        file.links.append((snapshot_file, os.stat(snapshot_file).st_ino, rows * file.row_bytes))

    def sealed_rows(self, plane: torch.Tensor) -> int:
        """Rows of a home file some snapshot holds: never to be written again in this file."""
        found = self._find(plane)
        return found[0].sealed_rows if found is not None else 0

    def _require(self, plane: torch.Tensor) -> tuple[_File, int]:
        found = self._find(plane)
        if found is None:
            raise ValueError("not a tensor of the disk tier")
        return found

    # -- lifetime --------------------------------------------------------------------------------------
    def drop_cache(self) -> None:
        """Writes the files back and evicts their pages from memory (benchmarks: the next reads hit the disk).

        A mapped page stays cached while any mapping uses it: it is released from this mapping first."""
        for file in self._files.values():
            file.mapping.flush()
            file.mapping.madvise(mmap.MADV_DONTNEED)
            with open(file.path, "rb") as handle:
                os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)

    def free(self, tensor: torch.Tensor) -> None:
        file = self._files.pop(tensor.data_ptr(), None)
        if file is not None:
            self._bases.remove(tensor.data_ptr())
            _close(file)

    def close(self) -> None:
        self._finalizer()
        self._bases.clear()


def _close(file: _File) -> None:
    """Unmaps and deletes a home file; its snapshot links keep their prefix only."""
    try:
        file.mapping.close()
    except BufferError:  # a tensor still views it: the pages go when that tensor does
        logger.debug("KV file %s still in use; unlinking only", file.path)
    try:
        os.close(file.fd)
    except OSError:
        pass
    file.path.unlink(missing_ok=True)
    for snapshot_file, inode, num_bytes in file.links:
        try:
            if os.stat(snapshot_file).st_ino == inode:  # still this file (not deleted and made anew)
                os.truncate(snapshot_file, num_bytes)
        except OSError:  # the snapshot was deleted meanwhile, or its store is read-only now: nothing to trim
            pass


def _reserve(fd: int, num_bytes: int, folder: Path) -> None:
    """Gives the file at ``fd`` ``num_bytes`` of real blocks: ``posix_fallocate``; where there is none (Windows, or
    Windows-shaped) the free space is checked and the file extended, which NTFS allocates (its files are not sparse)."""
    if hasattr(os, "posix_fallocate") and not windows_rules():
        os.posix_fallocate(fd, 0, num_bytes)
        return
    if num_bytes > shutil.disk_usage(folder).free:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    os.ftruncate(fd, num_bytes)


def _remove(files: dict, folder: Path) -> None:
    for file in files.values():
        _close(file)
    files.clear()
    shutil.rmtree(folder, ignore_errors=True)
