"""Disk-tier homes through small pinned staging buffers, on one worker thread.

A disk home is a file mapping: pageable memory whose pages may still be on disk. A CUDA copy straight from it
faults those pages in inside the driver's copy, serialised with everything else on the copy stream, and a
copy to pageable memory blocks the thread that issues it. So disk homes move on a worker thread instead:

    fetch:   mapped rows -> a pinned piece buffer (the page faults here are the disk read)
             -> h2d copy of the piece into the ping-pong buffer, enqueued by the worker; pieces pipeline
             (the disk read of one overlaps the h2d copy of the last), and the fetch's ``ready`` event is
             recorded after the last one
    append:  d2h copy of the chunk into a pinned write buffer, on the d2h stream (``Transfer.append``)
             -> the worker waits for it and writes the rows into the mapping (``GroupHome.write_planes``,
             which extends the file's running checksum)

The worker runs jobs in submission order, so a fetch always sees every append submitted before it; callers
join a fetch's job before waiting on its event (``Transfer.acquire``). On synchronous streams (a CPU-only
machine: no device copy to pipeline with) the worker copies the rows straight into the host ping-pong buffer,
which still overlaps the disk read with the main thread's attention of the group before, and appends are
written at once. Streams, events, copies and pinned memory come from the streams seam (``streams.py``). Pinned memory stays small and fixed: ``NUM_PIECES`` pieces of
``PIECE_BYTES`` plus ``WRITES_PER_GROUP`` buffers per head group of one chunk of one home.

A failed job (a disk read or write error) is *sticky*: jobs after it fail too rather than read rows that were
never written, until the failure has been reported to a caller (``result`` of its job, or ``drain``).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..errors import DiskStreamError
from .ledger import DISK_STREAM, Ledger

if TYPE_CHECKING:
    from .homes import GroupHome

PIECE_BYTES = 8 << 20  # one disk -> pinned -> device step: small enough to pipeline a fetch
NUM_PIECES = 4
WRITES_PER_GROUP = 2  # write buffers per head group of a layer: one layer's appends never wait for each other
_ALIGN = 64  # planes packed in one write buffer start at this alignment (any dtype may view them)


@dataclass
class _Pinned:
    data: torch.Tensor  # uint8, page-locked
    event: object  # fetch pieces: h2d finished reading it; write buffers: the d2h copy into it landed
    recorded: bool = False
    job: Future | None = None  # write buffers: the worker job that empties it


class DiskStream:
    """The worker and the pinned buffers that disk homes move through (one per cache)."""

    def __init__(self, streams, num_groups: int = 1, memory=None, ledger: Ledger | None = None):
        self.streams = streams
        self.ledger = ledger if ledger is not None else Ledger()  # the pieces' and write buffers' bytes
        self.memory = memory  # the DiskMemory: rows are read from its files with preadv where it can
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-disk")
        self._jobs: list[Future] = []  # submitted and not yet seen finished (main thread only)
        self._error: BaseException | None = None  # the first failure not yet reported (sticky, see above)
        self._pieces: list[_Pinned] = []
        self._writes: list[_Pinned] = []
        self._num_writes = WRITES_PER_GROUP * num_groups
        self._next_piece = self._next_write = 0
        self.num_fetches = 0  # disk homes' fetches handed to the worker
        self.num_paged = 0  # reads that went through the mapping's page faults instead of preadv
        if streams.is_async:
            # Blocking events: the worker sleeps in synchronize() instead of spinning a core host attention uses.
            self._pieces = [_Pinned(self._pinned(PIECE_BYTES), streams.event(blocking=True))
                            for _ in range(NUM_PIECES)]

    # -- fetches ---------------------------------------------------------------------------------------
    def fetch(self, home: GroupHome, start: int, stop: int, targets: list[torch.Tensor], h2d, ready) -> Future:
        """Copies rows [start, stop) of each plane of a disk home into ``targets`` ([stop - start, ...] each, in
        the buffer attention will read). The copies run on ``h2d`` and ``ready`` is recorded there after them;
        the caller has already made ``h2d`` wait for whatever must precede the copies."""
        self.num_fetches += 1
        if not self.streams.is_async:
            return self._submit(self._copy_rows, home, start, stop, targets)
        return self._submit(self._fetch_pieces, home, start, stop, targets, h2d, ready)

    def _fetch_pieces(self, home: GroupHome, start: int, stop: int, targets: list[torch.Tensor], h2d,
                      ready) -> None:
        streams = self.streams
        with streams.use(h2d):  # this thread's current stream: the copies below are ordered on h2d
            for plane, target in enumerate(targets):
                done = 0
                for rows in home.spans(start, stop, plane):  # one view, two where a ring wraps
                    if rows.shape[0] == 0:
                        continue  # (an empty range: a chunk at the start of a window; found on emulated streams)
                    per_piece = max(1, PIECE_BYTES // (rows[0].nbytes or 1))
                    for first in range(0, rows.shape[0], per_piece):
                        part = rows[first : first + per_piece]
                        piece = self._next_free_piece(part.nbytes)
                        staged = piece.data[: part.nbytes].view(part.dtype).view(part.shape)
                        self._read(part, staged)  # the disk read, off the main thread
                        streams.copy(target[done : done + part.shape[0]], staged, "a disk fetch's piece")
                        piece.event.record(h2d)
                        done += part.shape[0]
            ready.record(h2d)

    def _next_free_piece(self, num_bytes: int) -> _Pinned:
        """The next pinned piece buffer (worker thread), once the h2d copy out of its last use has finished."""
        piece = self._pieces[self._next_piece]
        self._next_piece = (self._next_piece + 1) % len(self._pieces)
        if piece.recorded:
            piece.event.synchronize()
        piece.recorded = True  # (its event is recorded right after the copy out of it is enqueued)
        if piece.data.numel() < num_bytes:  # one row larger than a piece (huge batch x head group)
            self.streams.forget(piece.data)
            piece.data = self._pinned(num_bytes)
        return piece

    def _copy_rows(self, home: GroupHome, start: int, stop: int, targets: list[torch.Tensor]) -> None:
        for plane, target in enumerate(targets):
            done = 0
            for rows in home.spans(start, stop, plane):  # one view, two where a ring wraps
                self._read(rows, target[done : done + rows.shape[0]])
                done += rows.shape[0]

    def _read(self, rows: torch.Tensor, target: torch.Tensor) -> None:
        self.streams.host_read(rows, "a disk home's rows")
        self.streams.host_write(target, "the buffer a disk read fills")
        if rows.numel() and (self.memory is None or not self.memory.read_into(rows, target)):
            self.num_paged += 1
            target.copy_(rows)  # page faults: the kernel reads what is not cached

    # -- appends ---------------------------------------------------------------------------------------
    def append(self, home: GroupHome, position: int, parts: list[torch.Tensor]) -> Future | None:
        """Stores ``parts`` (one block per plane, on the device) at rows [position, ...) of a disk home.

        The call runs with the d2h stream current: the chunk is copied into a pinned write buffer there, and
        the worker writes it into the file once it has landed (the returned job). On synchronous streams it is
        written here (None)."""
        streams = self.streams
        if not streams.is_async:
            home.write_planes(position, parts)
            return None
        if not self._writes:
            self._writes = [_Pinned(self._pinned(1), streams.event(blocking=True)) for _ in range(self._num_writes)]
        buffer = self._writes[self._next_write]
        self._next_write = (self._next_write + 1) % len(self._writes)
        if buffer.job is not None:
            # Its last chunk is in the file. (A failure there is sticky: the jobs that follow report it.)
            wait([buffer.job])
            streams.joined(buffer.job)
        offsets, total = [], 0
        for part in parts:
            offsets.append(total)
            total += -(-part.nbytes // _ALIGN) * _ALIGN
        if buffer.data.numel() < total:
            streams.forget(buffer.data)
            buffer.data = self._pinned(total)
        staged = [buffer.data[o : o + p.nbytes].view(p.dtype).view(p.shape) for o, p in zip(offsets, parts)]
        for target, part in zip(staged, parts):
            streams.copy(target, part, "a disk append's write buffer")
        buffer.event.record(streams.current())
        buffer.job = self._submit(self._write_landed, home, position, staged, buffer.event)
        return buffer.job

    def _write_landed(self, home: GroupHome, position: int, staged: list[torch.Tensor], landed) -> None:
        landed.synchronize()  # the d2h copy into the pinned buffer has finished
        home.write_planes(position, staged, self._host_copy)

    def _host_copy(self, dst: torch.Tensor, src: torch.Tensor, what: str) -> None:
        """A copy on this (worker) thread, declared to the streams seam's checker."""
        self.streams.host_read(src, "a disk append's write buffer")
        self.streams.host_write(dst, what)
        dst.copy_(src)

    def _pinned(self, num_bytes: int) -> torch.Tensor:
        self.ledger.check(DISK_STREAM, max(num_bytes, 1), "cpu")
        return self.ledger.record(DISK_STREAM, self.streams.pinned((max(num_bytes, 1),), torch.uint8))

    # -- bookkeeping -----------------------------------------------------------------------------------
    def _submit(self, fn, *args) -> Future:
        self._jobs = [job for job in self._jobs if not job.done()]
        job = self.streams.submit(self._worker, self._run, fn, *args)
        self._jobs.append(job)
        return job

    def _run(self, fn, *args) -> None:
        """A job on the worker: refused after an unreported failure, and recorded as one if it fails."""
        if self._error is not None:
            raise DiskStreamError("an earlier disk-tier job failed") from self._error
        try:
            fn(*args)
        except BaseException as error:
            self._error = error
            raise

    def acknowledge(self) -> None:
        """The caller has seen a job fail (its ``result`` raised): later jobs may run again."""
        self._error = None

    def drain(self) -> None:
        """Returns once every job submitted so far has finished; raises an unreported failure (once)."""
        wait(list(self._jobs))
        for job in self._jobs:
            self.streams.joined(job)
        self._jobs = [job for job in self._jobs if not job.done()]
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """Stops the worker once its jobs have run; raises a failure not yet reported. (Callers drained it
        already: ``Transfer.synchronize`` runs first, so the jobs are not waited for twice.)"""
        self._worker.shutdown(wait=True)
        error, self._error = self._error, None
        if error is not None:
            raise error

