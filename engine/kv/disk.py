"""The disk tier: homes in files, for the part of a plan beyond host RAM (exact, only slower).

Each disk home is one file, mapped into the address space (``mmap``) and seen as a tensor: fetches read it
like any host home (page faults become disk reads) and appends write it (the kernel writes the dirty pages
back). Space is reserved with ``posix_fallocate`` when a file is made, so a full disk is a clear ``OSError``
up front, never a crash on a later write into a sparse file. ``read_ahead`` asks the kernel to start reading
a range the schedule will fetch next (``MADV_WILLNEED``), which overlaps disk reads with compute as the h2d
prefetch does. Files live in a fresh folder under ``disk_dir`` and are deleted on ``close``.
"""

from __future__ import annotations

import logging
import mmap
import os
import shutil
import tempfile
import weakref
from pathlib import Path

import torch

logger = logging.getLogger(__name__)


class DiskTierError(OSError):
    """The disk tier could not be set up or grown (no space, a missing or read-only folder)."""


class DiskMemory:
    """Makes file-backed tensors under ``folder``; ``close`` unmaps and deletes them."""

    def __init__(self, folder: str | os.PathLike):
        root = Path(folder).expanduser()
        try:
            root.mkdir(parents=True, exist_ok=True)
            self.folder = Path(tempfile.mkdtemp(prefix="kv-", dir=root))
        except OSError as error:
            raise DiskTierError(f"cannot use {root} for the KV disk tier: {error.strerror or error}") from error
        self._maps: dict[int, tuple[mmap.mmap, Path]] = {}  # data_ptr -> (mapping, file)
        self._count = 0
        self._finalizer = weakref.finalize(self, _remove, self._maps, self.folder)

    @property
    def nbytes(self) -> int:
        return sum(m.size() for m, _ in self._maps.values())

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        num_bytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        path = self.folder / f"home-{self._count:05d}.kv"
        self._count += 1
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.posix_fallocate(fd, 0, max(num_bytes, 1))  # real blocks now: ENOSPC here, not SIGBUS later
                mapping = mmap.mmap(fd, max(num_bytes, 1))
            finally:
                os.close(fd)
        except OSError as error:
            path.unlink(missing_ok=True)
            free = shutil.disk_usage(self.folder).free if self.folder.exists() else 0
            raise DiskTierError(f"cannot make a {num_bytes / 2**30:.2f} GiB KV file in {self.folder} "
                                f"({error.strerror or error}; {free / 2**30:.1f} GiB free)") from error
        with torch.inference_mode(False):
            tensor = torch.frombuffer(mapping, dtype=torch.uint8, count=num_bytes).view(dtype).view(shape)
        self._maps[tensor.data_ptr()] = (mapping, path)
        return tensor

    def read_ahead(self, tensor: torch.Tensor) -> None:
        """Asks the kernel to read the pages of ``tensor`` (a view into a disk home) in the background."""
        for base, (mapping, _) in self._maps.items():
            offset = tensor.data_ptr() - base
            if 0 <= offset < mapping.size():
                start = offset - offset % mmap.PAGESIZE
                length = min(mapping.size() - start, tensor.nbytes + offset - start)
                try:
                    mapping.madvise(mmap.MADV_WILLNEED, start, length)
                except (OSError, ValueError, AttributeError):  # advice only: never fail a fetch over it
                    pass
                return

    def drop_cache(self) -> None:
        """Writes the files back and evicts their pages from memory (benchmarks: the next reads hit the disk).

        A mapped page stays cached while any mapping uses it: it is released from this mapping first."""
        for mapping, path in self._maps.values():
            mapping.flush()
            mapping.madvise(mmap.MADV_DONTNEED)
            with open(path, "rb") as file:
                os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)

    def free(self, tensor: torch.Tensor) -> None:
        entry = self._maps.pop(tensor.data_ptr(), None)
        if entry is not None:
            _unmap(*entry)

    def close(self) -> None:
        self._finalizer()


def _unmap(mapping: mmap.mmap, path: Path) -> None:
    try:
        mapping.close()
    except BufferError:  # a tensor still views it: the pages go when that tensor does
        logger.debug("KV file %s still in use; unlinking only", path)
    path.unlink(missing_ok=True)


def _remove(maps: dict, folder: Path) -> None:
    for mapping, path in maps.values():
        _unmap(mapping, path)
    maps.clear()
    shutil.rmtree(folder, ignore_errors=True)
