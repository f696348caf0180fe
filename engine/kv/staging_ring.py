"""Homes in ordinary (pageable) memory, fetched through a small ring of pinned buffers that the copies overlap with.

When the KV store is larger than what this machine lets us pin (``pin_budget.py``), the homes past the budget stay
pageable. A CUDA copy straight from pageable memory is staged by the driver and blocks the thread that issues it,
so such a fetch instead runs on one worker thread:

    fetch:  the appends of earlier chunks have landed in the home (their d2h event, synchronized here: this thread
            reads the home) -> for each piece of at most a ring buffer: wait until the buffer's last h2d copy has
            read it (its event), memcpy home rows -> buffer, then enqueue the h2d copy buffer -> ping-pong buffer and
            record the buffer's event; the fetch's ``ready`` is recorded after the last piece

so the memcpy of one piece overlaps the h2d copy of the one before, and the main thread attends the group before
meanwhile. The caller has already made h2d wait for what must precede the copies (the buffer's ``free``) and joins
the job before it waits on ``ready`` (``Transfer.acquire``). The ring's buffers are pinned when it is made, before
any home, so a driver that refuses pins past its cap (and, under WDDM, every pin after) never meets them.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import torch

from .ledger import HOST_IO, Ledger

logger = logging.getLogger(__name__)

NUM_BUFFERS = 4
MAX_BUFFER_BYTES = 64 << 20  # a head group of a 128K-token 8B model: 128K rows of 512 bytes
#: Of the pin budget's room when the ring is made, the share its buffers may take (the rest: homes, later pins).
RING_SHARE = 0.25


@dataclass
class _RingBuffer:
    data: torch.Tensor  # uint8, page-locked
    free: object  # event: recorded on h2d after the copy out of the buffer was enqueued
    recorded: bool = False


class StagingRing:
    """The pinned buffers and the worker that move pageable homes to the device (one per cache)."""

    def __init__(self, streams, budget, buffer_bytes: int, num_buffers: int = NUM_BUFFERS,
                 ledger: Ledger | None = None):
        self.streams, self.budget = streams, budget
        self.ledger = ledger if ledger is not None else Ledger()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-ring")
        self._jobs: list[Future] = []
        # Blocking events: the worker sleeps in synchronize() instead of spinning a core host attention uses.
        self._buffers = [_RingBuffer(self._pinned(buffer_bytes), streams.event(blocking=True))
                         for _ in range(num_buffers)]
        self._next = 0
        self.num_fetches = 0  # fetches of pageable homes through the ring
        self.bytes_staged = 0  # bytes memcpy'd into its buffers
        self.copy_seconds = 0.0  # the worker's time in those memcpys (the staging's cost beside the h2d copies)

    @classmethod
    def for_streams(cls, streams, row_bytes: int, rows: int, ledger: Ledger | None = None) -> StagingRing | None:
        """A ring where the streams have a pin *limit* (asynchronous copies only), buffers of ``rows`` rows of a
        head group (at most ``MAX_BUFFER_BYTES``, and all of them at most ``RING_SHARE`` of the budget's room); else
        None: every home is pinned, as before there were budgets."""
        budget = getattr(streams, "pin_budget", None)
        if budget is None or not budget.is_limited or not streams.is_async:
            return None
        share = int(budget.room() * RING_SHARE) // NUM_BUFFERS
        size = max(row_bytes, min(rows * row_bytes, MAX_BUFFER_BYTES, share))
        logger.info("staging ring: %d pinned buffers of %.2f MiB (pin limit %.2f GiB)", NUM_BUFFERS, size / 2**20,
                    budget.limit / 2**30)
        return cls(streams, budget, size, ledger=ledger)

    @property
    def buffer_bytes(self) -> int:
        return min(b.data.numel() for b in self._buffers)

    @property
    def pinned_bytes(self) -> int:
        return sum(b.data.numel() for b in self._buffers)

    def stages(self, home_tensor: torch.Tensor) -> bool:
        """Whether a home's plane is pageable (not pinned through the budget): its fetches go through the ring."""
        return not self.budget.holds(home_tensor)

    def fetch(self, dsts: list[torch.Tensor], srcs: list[torch.Tensor], h2d, landing, ready) -> Future:
        """Copies each ``srcs[i]`` (rows of a pageable home, token-major) into ``dsts[i]`` (the ping-pong buffer)
        through the ring's buffers, on ``h2d``, ``ready`` recorded after; ``landing``: the append event the home's
        rows wait for, or None. Returns the worker's job (join it before waiting on ``ready``)."""
        self.num_fetches += 1
        self._jobs = [job for job in self._jobs if not job.done()]
        job = self.streams.submit(self._worker, self._fetch, dsts, srcs, h2d, landing, ready)
        self._jobs.append(job)
        return job

    def _fetch(self, dsts: list[torch.Tensor], srcs: list[torch.Tensor], h2d, landing, ready) -> None:
        streams = self.streams
        if landing is not None:
            # This thread reads the home: earlier chunks' appends into it (d2h) must have landed.
            landing.synchronize()
        with streams.use(h2d):  # this thread's current stream: the copies below are ordered on h2d
            for dst, src in zip(dsts, srcs, strict=True):
                if src.numel() == 0:
                    continue
                per_buffer = max(1, self.buffer_bytes // (src[0].nbytes or 1))
                for first in range(0, src.shape[0], per_buffer):
                    part = src[first : first + per_buffer]
                    buffer = self._free_buffer(part.nbytes)
                    staged = buffer.data[: part.nbytes].view(part.dtype).view(part.shape)
                    streams.host_read(part, "a pageable home's rows")
                    streams.host_write(staged, "a staging ring buffer")
                    started = time.perf_counter()
                    staged.copy_(part)
                    self.copy_seconds += time.perf_counter() - started
                    self.bytes_staged += part.nbytes
                    streams.copy(dst[first : first + part.shape[0]], staged, "a staging ring buffer's rows")
                    buffer.free.record(h2d)
            ready.record(h2d)

    def _free_buffer(self, num_bytes: int) -> _RingBuffer:
        """The next buffer (worker thread), once the h2d copy out of its last use has read it."""
        buffer = self._buffers[self._next]
        self._next = (self._next + 1) % len(self._buffers)
        if buffer.recorded:
            buffer.free.synchronize()
        buffer.recorded = True  # (its event is recorded right after the copy out of it is enqueued)
        if buffer.data.numel() < num_bytes:  # one row larger than a buffer (a huge batch x head group)
            self.streams.forget(buffer.data)
            buffer.data = self._pinned(num_bytes)
        return buffer

    def _pinned(self, num_bytes: int) -> torch.Tensor:
        self.ledger.check(HOST_IO, num_bytes, "cpu")  # (the pinned host buffers' category)
        return self.ledger.record(HOST_IO, self.streams.pinned((max(num_bytes, 1),), torch.uint8))

    def drain(self) -> None:
        """Returns once every fetch handed to the worker has enqueued its copies (a failure is raised by the
        fetch's own join, ``Transfer._join``). What the worker did is learnt by synchronizing h2d after this (its
        last act is issuing ``ready`` there), as ``Transfer.fence`` does."""
        wait(list(self._jobs))
        self._jobs = []

    def close(self) -> None:
        """Stops the worker (after its jobs); call once the copies out of the buffers have run (``fence``)."""
        self._worker.shutdown(wait=True)
        for buffer in self._buffers:
            self.streams.forget(buffer.data)
