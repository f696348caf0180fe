"""Where a layer's KV cache lives: one home per (layer, head group), token-major.

A home is one tensor ``[capacity, B, 2, g, D]``: token first, then batch row, K or V, head, channel. Tokens
``[start, stop)`` of a whole group, keys and values, are therefore one contiguous span, so a fetch, an
append or a snapshot's write is a single contiguous copy, and a fetched span is already flash-attn's
``[B, S, H, D]`` order (for B = 1). Offloaded homes live in (pinned) host memory, resident homes on the
compute device. Capacity is pre-allocated from the plan and only grows (logged) past it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..errors import HomesFull, InputError
from .ledger import DISK, HOMES
from .pinned import HostMemory
from .quant import SCALE_DTYPE, dequantize, quantize, storage_dtype

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeadGroup:
    """KV heads ``[start, stop)`` of one layer, and whether their home is the compute device."""

    start: int
    stop: int
    is_resident: bool
    is_on_disk: bool = False  # an offloaded home in a file (the disk tier) instead of RAM

    @property
    def size(self) -> int:
        return self.stop - self.start


class GroupHome:
    """Storage of one (layer, head group); its layer knows how many tokens are valid.

    ``planes`` are token-major tensors sharing their first dimension: ``[kv]`` in the model's dtype, or, for an
    8-bit home (``quant.py``), ``[codes [capacity, B, 2, g, D], scales [capacity, B, 2, g, 1]]``.

    A home of a sliding-window layer is a *ring* (``window`` set): token ``p`` lives in row ``p % capacity``,
    and only the last ``capacity`` tokens exist. Its capacity is the window plus one chunk, so the tokens a
    future query can see are never overwritten by the chunk being appended (see ``LayerHomes``).
    """

    def __init__(self, group: HeadGroup, planes: list[torch.Tensor], window: int | None = None,
                 dtype: torch.dtype | None = None, kv_dtype: str | None = None):
        kv = planes[0]
        assert kv.dim() == 5 and kv.shape[2] == 2 and kv.shape[3] == group.size, tuple(kv.shape)
        self.group = group
        self.planes = planes
        self.window = window
        self.dtype = dtype or kv.dtype  # what attention reads (codes are dequantized to it)
        self.kv_dtype = kv_dtype  # None, or "int8" / "fp8": lossy 8-bit storage
        # Offloaded: in host memory and streamed through the ping-pong buffers. (On a CPU-only machine a
        # resident home is in host memory too, but it is read in place like any resident one.)
        self.is_host = not group.is_resident
        self.anchor: tuple[int, list[torch.Tensor]] | None = None  # (position, the window before it, per plane)
        self.disk = None  # the DiskMemory of a disk home that is not a ring: told of every write (its checksum)

    @property
    def kv(self) -> torch.Tensor:
        """[capacity, B, 2, g, D]: K/V in the model's dtype, or their 8-bit codes."""
        return self.planes[0]

    @property
    def is_quantized(self) -> bool:
        return self.kv_dtype is not None

    @property
    def is_ring(self) -> bool:
        return self.window is not None

    @property
    def capacity(self) -> int:
        return self.kv.shape[0]

    @property
    def nbytes(self) -> int:
        anchored = sum(t.nbytes for t in self.anchor[1]) if self.anchor is not None else 0
        return sum(p.nbytes for p in self.planes) + anchored

    @property
    def device(self) -> torch.device:
        return self.kv.device

    def spans(self, start: int, stop: int, plane: int = 0) -> list[torch.Tensor]:
        """Tokens [start, stop) of a plane as one or (a ring wrapping around) two contiguous views, in order."""
        tensor = self.planes[plane]
        return [tensor[row : row + num] for row, num in self.rows(start, stop)]

    def rows(self, start: int, stop: int) -> list[tuple[int, int]]:
        """Where tokens [start, stop) are: one or (a ring wrapping around) two (first row, rows), in token order."""
        if not self.is_ring:
            return [(start, stop - start)]
        num, capacity = stop - start, self.capacity
        assert 0 <= num <= capacity, (start, stop, capacity)
        first = start % capacity
        if first + num <= capacity:
            return [(first, num)]
        return [(first, capacity - first), (0, first + num - capacity)]

    def read(self, start: int, stop: int, plane: int = 0) -> torch.Tensor:
        """Tokens [start, stop) of a plane as one tensor (a view, or a copy where a ring wraps)."""
        parts = self.spans(start, stop, plane)
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def block(self, start: int, stop: int) -> torch.Tensor:
        """Tokens [start, stop) as [stop-start, B, 2, g, D] in the model's dtype (8-bit homes: dequantized)."""
        if not self.is_quantized:
            return self.read(start, stop)

        codes, scales = self.read(start, stop, 0), self.read(start, stop, 1)
        return dequantize(codes, scales, torch.empty(codes.shape, dtype=self.dtype, device=codes.device))

    def write(self, position: int, block: torch.Tensor, copy=None) -> None:
        """Stores block [n, B, 2, g, D] (the model's dtype) at tokens [position, position + n)."""
        if self.is_quantized:
            self.write_planes(position, list(quantize(block, self.kv_dtype)), copy)
        else:
            self.write_planes(position, [block], copy)

    def write_planes(self, position: int, parts: list[torch.Tensor], copy=None) -> None:
        """Copies one block per plane to tokens [position, position + n), split where a ring wraps.

        ``copy(dst, src, what)``: the streams seam's copy on its current stream (asynchronous there); default:
        a synchronous copy on this thread (restores, growth and crops run with no copy in flight)."""
        for plane, block in enumerate(parts):
            done = 0
            for part in self.spans(position, position + block.shape[0], plane):
                source = block[done : done + part.shape[0]]
                if copy is None:
                    part.copy_(source)
                else:
                    copy(part, source, "a KV home")
                done += part.shape[0]
                if self.disk is not None:  # a copy into a file's (pageable) mapping has landed on return
                    self.disk.note_written(part)

    def keys(self, start: int, stop: int) -> torch.Tensor:
        """[B, g, stop-start, D] keys (for inspection and tests; the hot path reads spans)."""
        return self.block(start, stop)[:, :, 0].permute(1, 2, 0, 3)

    def values(self, start: int, stop: int) -> torch.Tensor:
        return self.block(start, stop)[:, :, 1].permute(1, 2, 0, 3)


class LayerHomes:
    """All head groups of one layer: offloaded ones from ``host``, resident ones on ``device``.

    A sliding-window layer (``window`` W) keeps rings of ``W - 1 + chunk`` tokens: a chunk at [past, past + Q)
    reads [past - W + 1, past) and overwrites the ring rows of tokens [past - R, past + Q - R), all older than
    what it reads as long as Q <= chunk. Cropping back by more than a chunk needs the window that preceded the
    crop point, which ``anchor`` keeps for one position (the end of the document).
    """

    def __init__(self, groups: list[HeadGroup], batch: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device: torch.device, host: HostMemory, *, window: int | None = None,
                 chunk: int = 4096, kv_dtype: str | None = None, disk=None):
        self._host = host
        self._disk = disk  # DiskMemory for groups on the disk tier
        self.window = window  # the layer's attention window (snapshots save the window before their end)
        if window is not None and capacity < window - 1 + chunk:
            # The planned context never reaches past the window plus a chunk: every token fits without wrapping,
            # so the homes are plain (a ring this short would have to grow to window + chunk at the first append).
            window = None
        self.ring_window = window  # set when the homes are rings
        if window is not None:
            capacity = window - 1 + chunk
        # The layer's homes in RAM share one tensor per plane, ``[num stacked, capacity, B, 2, g, D]``: rows
        # [a, b) of adjacent groups are one view, so a layer's append and a fetch of adjacent groups are one
        # batched copy (``Transfer``), and one registration of page-locked memory serves the layer.
        self.stacked = [i for i, g in enumerate(groups) if not g.is_resident and not g.is_on_disk]
        self.stack: list[torch.Tensor] = []
        if self.stacked:
            self.stack = [self._host.empty((len(self.stacked), capacity, *shape), plane_dtype)
                          for shape, plane_dtype in _plane_specs(batch, groups[0].size, head_dim, dtype, kv_dtype)]
        self.homes = []
        for i, g in enumerate(groups):
            quantized = kv_dtype if not g.is_resident else None  # 8-bit where RAM binds: host homes
            if i in self.stacked:
                planes = [plane[self.stacked.index(i)] for plane in self.stack]  # contiguous views
            else:
                planes = [self._empty(g, (capacity, *shape), plane_dtype, device)
                          for shape, plane_dtype in _plane_specs(batch, g.size, head_dim, dtype, quantized)]
            self.homes.append(GroupHome(g, planes, window, dtype, quantized))
            if g.is_on_disk and window is None:
                self.homes[-1].disk = disk

    @property
    def chunk_room(self) -> int:
        """The longest chunk a ring can take without overwriting what the chunk itself reads."""
        return self.homes[0].capacity - (self.ring_window - 1) if self.ring_window is not None else 1 << 62

    def has_room(self, length: int, q_len: int) -> bool:
        """Whether ``q_len`` more tokens fit (all homes of a layer share one capacity)."""
        if self.ring_window is not None:
            return q_len <= self.chunk_room
        return length + q_len <= self.homes[0].capacity

    def oldest(self, length: int) -> int:
        """The first token the homes still hold when ``length`` tokens were appended."""
        return max(0, length - self.homes[0].capacity) if self.ring_window is not None else 0

    def _empty(self, group: HeadGroup, shape: tuple[int, ...], dtype, device) -> torch.Tensor:
        ledger = self._host.ledger  # (the cache's allocation point: every home's bytes are recorded there)
        if group.is_on_disk:
            ledger.check(HOMES, torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size(), DISK)
            return ledger.record(HOMES, self._disk.empty(tuple(shape), dtype), DISK)
        if group.is_resident:
            return ledger.empty(HOMES, shape, dtype, device)  # written in place later, also outside inference mode
        return self._host.empty(tuple(shape), dtype)

    def stacked_rows(self, start: int, stop: int, plane: int = 0) -> list[torch.Tensor]:
        """Tokens [start, stop) of every stacked home: one or (a ring wrapping) two ``[num stacked, n, ...]`` views."""
        tensor = self.stack[plane]
        return [tensor.narrow(1, row, num) for row, num in self.homes[self.stacked[0]].rows(start, stop)]

    def __iter__(self):
        return iter(self.homes)

    def __len__(self) -> int:
        return len(self.homes)

    def __getitem__(self, index: int) -> GroupHome:
        return self.homes[index]

    def nbytes(self, on_device: bool) -> int:
        """Bytes of the homes on the compute device (``on_device``) or in RAM (the disk tier not counted)."""
        return sum(h.nbytes for h in self.homes if (h.device.type != "cpu") == on_device and not h.group.is_on_disk)

    @property
    def disk_bytes(self) -> int:
        return sum(h.nbytes for h in self.homes if h.group.is_on_disk)

    def reserve(self, num_tokens: int, num_valid: int, chunk: int, *, fixed_device: bool = False) -> None:
        """Makes room for ``num_tokens`` keeping the first ``num_valid`` (rings: room for a ``chunk``-token
        append); the caller has fenced the copy streams.

        A home grows by a chunk (or to ``num_tokens``), never doubles, one home at a time (the stacked homes of the
        layer together, as they share their planes): its old and new planes are the only copies alive (the kept rows
        are copied straight from the old planes). With ``fixed_device``
        (the plan fixed the capacity) a home on a GPU never grows: the plan's device memory is spent elsewhere, so
        ``HomesFull`` is raised before anything changes."""
        growing = [home for home in self.homes
                   if (home.is_ring and self.ring_window - 1 + chunk > home.capacity)
                   or (not home.is_ring and num_tokens > home.capacity)]
        if fixed_device and any(home.device.type == "cuda" and not home.is_ring for home in growing):
            raise HomesFull(f"the context ({num_tokens:,} tokens) passed the {self.homes[0].capacity:,} tokens its GPU-"
                            "resident KV homes were planned for; plan a larger max_context (or drop older turns)")
        stacked = {id(self.homes[i]) for i in self.stacked}
        if any(id(home) in stacked for home in growing):  # they share a capacity: they grow together
            home = self.homes[self.stacked[0]]
            needed = self.ring_window - 1 + chunk if home.is_ring else max(num_tokens, home.capacity + chunk)
            logger.info("growing the KV homes of %d head groups from %d to %d tokens (plan max_context / chunk_size "
                        "to avoid this)", len(self.stacked), home.capacity, needed)
            first = max(0, num_valid - home.capacity) if home.is_ring else 0
            homes = [self.homes[i] for i in self.stacked]
            old = self.stack
            kept = [[h.read(first, num_valid, p) for p in range(len(old))] for h in homes]  # in token order
            self.stack = [self._host.empty((len(homes), needed, *p.shape[2:]), p.dtype) for p in old]
            for index, h in enumerate(homes):
                h.planes = [plane[index] for plane in self.stack]
                h.write_planes(first, kept[index])
            del kept
            for plane in old:
                self._host.free(plane)
        for home in growing:
            if id(home) in stacked:
                continue  # grown with the stack above
            needed = self.ring_window - 1 + chunk if home.is_ring else max(num_tokens, home.capacity + chunk)
            logger.info("growing KV home of heads %d-%d from %d to %d tokens (plan max_context / chunk_size to "
                        "avoid this)", home.group.start, home.group.stop, home.capacity, needed)
            first = max(0, num_valid - home.capacity) if home.is_ring else 0
            old = home.planes
            # Views of the old planes (a ring that wraps: a copy of its window), read before they are replaced.
            kept = [home.read(first, num_valid, p) for p in range(len(old))]  # in token order
            home.planes = [self._empty(home.group, (needed, *p.shape[1:]), p.dtype, p.device) for p in old]
            home.write_planes(first, kept)
            del kept
            if home.is_host:
                for plane in old:
                    (self._disk if home.group.is_on_disk else self._host).free(plane)

    def set_anchor(self, position: int) -> None:
        """Keeps a copy of the window before ``position`` (rings only), so ``crop_to`` can return to it."""
        if self.ring_window is None:
            return
        first = max(0, position - (self.ring_window - 1))
        for home in self.homes:
            home.anchor = (position, [home.read(first, position, p).clone() for p in range(len(home.planes))])

    def can_crop_to(self, position: int, length: int) -> bool:
        if self.ring_window is None or position == length or position == 0:
            return True
        first = max(0, position - (self.ring_window - 1))
        return first >= self.oldest(length) or self.homes[0].anchor is not None and self.homes[0].anchor[0] == position

    def crop_to(self, position: int, length: int) -> None:
        """Makes the rings hold the window before ``position`` again (from the anchor if it was overwritten),
        and moves disk homes a snapshot links to fresh files if rows it holds would be written again."""
        self._unseal(position)
        if self.ring_window is None or position >= length or position == 0:
            return
        first = max(0, position - (self.ring_window - 1))
        if first >= self.oldest(length):
            return
        anchor = self.homes[0].anchor
        if anchor is None or anchor[0] != position:
            raise InputError(f"cannot crop a sliding-window layer back from {length} to {position} tokens: the ring "
                             "no longer holds the window before it (anchor that position first)")
        for home in self.homes:
            home.write_planes(first, home.anchor[1])


    def _unseal(self, position: int) -> None:
        """Gives every disk home whose rows past ``position`` a snapshot holds (``disk.py``) a fresh file with
        its first ``position`` rows, so the snapshot's bytes are never written again."""
        for home in self.homes:
            if not home.group.is_on_disk or all(self._disk.sealed_rows(p) <= position for p in home.planes):
                continue
            logger.info("KV heads %d-%d: moving to a fresh disk file (a saved snapshot holds the old one)",
                        home.group.start, home.group.stop)
            old = home.planes
            home.planes = [self._empty(home.group, tuple(p.shape), p.dtype, p.device) for p in old]
            home.write_planes(0, [p[:position] for p in old])
            for plane in old:
                self._disk.free(plane)


def _plane_specs(batch: int, group_size: int, head_dim: int, dtype: torch.dtype, kv_dtype: str | None):
    """(shape after the token dimension, dtype) of each plane of a home."""
    if kv_dtype is None:
        return [((batch, 2, group_size, head_dim), dtype)]

    return [((batch, 2, group_size, head_dim), storage_dtype(kv_dtype)), ((batch, 2, group_size, 1), SCALE_DTYPE)]
