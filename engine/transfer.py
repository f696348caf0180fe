"""Host <-> device movement of KV: the named streams, the two ping-pong buffers and their events.

On CUDA three streams take part: the compute stream (whatever is current), ``h2d`` (fetching the next
head group's past into a free buffer) and ``d2h`` (appending a chunk's new K/V to host homes). Without
CUDA the same calls run synchronously, so the schedule in ``attention.py`` is one loop either way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from .kv_store import GroupHome

logger = logging.getLogger(__name__)

Slot = tuple[int, int]  # (layer index, head-group index)


@dataclass
class _Fetch:
    buffer: int
    start: int
    stop: int
    ready: torch.cuda.Event | None


class Transfer:
    """Owns the streams and the ping-pong buffers of one cache."""

    def __init__(self, device: torch.device, overlap: bool, initial_capacity: int):
        self.device = device
        self.is_cuda = device.type == "cuda"
        self.overlap = overlap
        self.h2d = torch.cuda.Stream(device) if self.is_cuda else None
        self.d2h = torch.cuda.Stream(device) if self.is_cuda else None
        self._initial_capacity = initial_capacity
        self._buffers: list[tuple[torch.Tensor, torch.Tensor] | None] = [None, None]  # [g, B, cap, D] each
        self._buffer_free: list[torch.cuda.Event | None] = [None, None]
        self._next_buffer = 0
        self._pending: dict[Slot, _Fetch] = {}
        self._host_written: dict[int, torch.cuda.Event] = {}

    # -- appends ---------------------------------------------------------------------------------
    def store(self, layer_idx: int, home: GroupHome, key: torch.Tensor, value: torch.Tensor, position: int) -> None:
        """Writes this chunk's K/V ([B, KVH, Q, D], contiguous) into ``home`` at ``position``."""
        if not self.is_cuda or home.device.type != "cpu":
            home.write(key, value, position)  # same device, or a synchronous CPU copy
            return
        produced = torch.cuda.current_stream(self.device).record_event()
        with torch.cuda.stream(self.d2h):
            # The copy must not start before the compute stream has produced these K/V.
            self.d2h.wait_event(produced)
            home.write(key, value, position)
            # The compute stream may free key/value as soon as the layer returns; keep them until this copy runs.
            key.record_stream(self.d2h)
            value.record_stream(self.d2h)
            self._host_written[layer_idx] = self.d2h.record_event()

    # -- fetches ---------------------------------------------------------------------------------
    def prefetch(self, slot: Slot, home: GroupHome, start: int, stop: int, total: int) -> None:
        """Starts copying home tokens [start, stop) into the free buffer; ``total`` is the room it needs
        (past plus the chunk that will be appended on the device)."""
        if slot in self._pending:
            return
        index = self._next_buffer
        self._next_buffer ^= 1
        keys, values = self._buffer(index, home, total)
        if not self.is_cuda:
            _copy_heads(keys, values, home, start, stop, non_blocking=False)
            self._pending[slot] = _Fetch(index, start, stop, None)
            return
        with torch.cuda.stream(self.h2d):
            if self._buffer_free[index] is not None:
                # The compute stream may still be reading this buffer's previous group.
                self.h2d.wait_event(self._buffer_free[index])
            if slot[0] in self._host_written:
                # Host homes of this layer may still be receiving an earlier chunk on the d2h stream.
                self.h2d.wait_event(self._host_written[slot[0]])
            _copy_heads(keys, values, home, start, stop, non_blocking=True)
            ready = self.h2d.record_event()
        self._pending[slot] = _Fetch(index, start, stop, ready)

    def acquire(self, slot: Slot, home: GroupHome, start: int, stop: int, total: int) -> int:
        """Returns the buffer index holding home tokens [start, stop), fetching now if not prefetched."""
        fetch = self._pending.pop(slot, None)
        if fetch is not None and (fetch.start, fetch.stop) != (start, stop):
            logger.debug("prefetched range of %s was %s, needed %s: refetching", slot, (fetch.start, fetch.stop), (start, stop))
            self.release(fetch.buffer)
            fetch = None
        if fetch is None:
            self.prefetch(slot, home, start, stop, total)
            fetch = self._pending.pop(slot)
        if fetch.ready is not None:
            # Attention must not read the buffer before its copy has landed.
            torch.cuda.current_stream(self.device).wait_event(fetch.ready)
        return fetch.buffer

    def buffer_with_chunk(self, index: int, group_size: int, past: int,
                          key: torch.Tensor, value: torch.Tensor, heads: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Appends this chunk's K/V (device tensors [B, KVH, Q, D]) after ``past`` fetched tokens.

        Returns [B, g, past + Q, D] views of the buffer.
        """
        keys, values = self._buffers[index]
        q_len = key.shape[2]
        keys[:group_size, :, past : past + q_len].copy_(key[:, heads].transpose(0, 1))
        values[:group_size, :, past : past + q_len].copy_(value[:, heads].transpose(0, 1))
        return (keys[:group_size, :, : past + q_len].transpose(0, 1),
                values[:group_size, :, : past + q_len].transpose(0, 1))

    def release(self, index: int) -> None:
        """Marks the end of the compute stream's use of a buffer."""
        if self.is_cuda:
            self._buffer_free[index] = torch.cuda.current_stream(self.device).record_event()

    # -- bookkeeping -----------------------------------------------------------------------------
    def forget_pending(self) -> None:
        """Drops fetches a cancelled or interrupted forward left behind (their buffers stay valid)."""
        for fetch in self._pending.values():
            self.release(fetch.buffer)
        self._pending.clear()

    def synchronize(self) -> None:
        """Waits for every copy in flight, e.g. before the host store is read or resized."""
        if self.is_cuda:
            self.h2d.synchronize()
            self.d2h.synchronize()
            torch.cuda.current_stream(self.device).synchronize()

    @property
    def buffer_bytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in filter(None, self._buffers))

    def free_buffers(self) -> None:
        self.synchronize()
        self.forget_pending()
        self._buffers = [None, None]
        self._buffer_free = [None, None]

    def _buffer(self, index: int, home: GroupHome, total: int) -> tuple[torch.Tensor, torch.Tensor]:
        g, batch, _, head_dim = home.keys.shape
        current = self._buffers[index]
        if current is not None and current[0].shape[0] >= g and current[0].shape[1] == batch and current[0].shape[2] >= total:
            return current
        capacity = max(total, self._initial_capacity)
        if current is not None:
            capacity = max(capacity, current[0].shape[2] + current[0].shape[2] // 2)
            g = max(g, current[0].shape[0])
            logger.info("growing ping-pong buffer %d to %d tokens x %d heads", index, capacity, g)
            self.synchronize()  # rare (context beyond the plan): simplest safe point to drop the old buffer
        shape = (g, batch, capacity, head_dim)
        self._buffers[index] = (torch.empty(shape, dtype=home.keys.dtype, device=self.device),
                                torch.empty(shape, dtype=home.keys.dtype, device=self.device))
        self._buffer_free[index] = None
        return self._buffers[index]


def _copy_heads(keys: torch.Tensor, values: torch.Tensor, home: GroupHome, start: int, stop: int,
                non_blocking: bool) -> None:
    # One contiguous copy per (head, batch row): a strided cross-device copy would stage through pageable memory.
    n = stop - start
    for i in range(home.group.size):
        for b in range(home.keys.shape[1]):
            keys[i, b, :n].copy_(home.keys[i, b, start:stop], non_blocking=non_blocking)
            values[i, b, :n].copy_(home.values[i, b, start:stop], non_blocking=non_blocking)
