"""Where a layer's KV cache lives: one home per (layer, head group), token-major.

A home is one tensor ``[capacity, B, 2, g, D]``: token first, then batch row, K or V, head, channel. Tokens
``[start, stop)`` of a whole group, keys and values, are therefore one contiguous block, so a fetch, an
append or a snapshot run is a single contiguous copy, and a fetched block is already flash-attn's
``[B, S, H, D]`` order (for B = 1). Offloaded homes live in (pinned) host memory, resident homes on the
compute device. Capacity is pre-allocated from the plan and only grows (logged) past it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from .pinned import HostMemory

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeadGroup:
    """KV heads ``[start, stop)`` of one layer, and whether their home is the compute device."""

    start: int
    stop: int
    is_resident: bool

    @property
    def size(self) -> int:
        return self.stop - self.start


class GroupHome:
    """Storage of one (layer, head group); its layer knows how many tokens are valid.

    A home of a sliding-window layer is a *ring* (``window`` set): token ``p`` lives in row ``p % capacity``,
    and only the last ``capacity`` tokens exist. Its capacity is the window plus one chunk, so the tokens a
    future query can see are never overwritten by the chunk being appended (see ``LayerHomes``).
    """

    def __init__(self, group: HeadGroup, kv: torch.Tensor, window: int | None = None):
        assert kv.dim() == 5 and kv.shape[2] == 2 and kv.shape[3] == group.size, tuple(kv.shape)
        self.group = group
        self.kv = kv  # [capacity, B, 2, g, D]
        self.window = window
        # Offloaded: in host memory and streamed through the ping-pong buffers. (On a CPU-only machine a
        # resident home is in host memory too, but it is read in place like any resident one.)
        self.is_host = not group.is_resident
        self.anchor: tuple[int, torch.Tensor] | None = None  # (position, the window before it), see LayerHomes

    @property
    def is_ring(self) -> bool:
        return self.window is not None

    @property
    def capacity(self) -> int:
        return self.kv.shape[0]

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes + (self.anchor[1].nbytes if self.anchor is not None else 0)

    @property
    def device(self) -> torch.device:
        return self.kv.device

    def blocks(self, start: int, stop: int) -> list[torch.Tensor]:
        """Tokens [start, stop) as one or (a ring wrapping around) two contiguous [n, B, 2, g, D] views, in order."""
        if not self.is_ring:
            return [self.kv[start:stop]]
        num, capacity = stop - start, self.capacity
        assert 0 <= num <= capacity, (start, stop, capacity)
        first = start % capacity
        if first + num <= capacity:
            return [self.kv[first : first + num]]
        return [self.kv[first:], self.kv[: first + num - capacity]]

    def block(self, start: int, stop: int) -> torch.Tensor:
        """Tokens [start, stop) as one [stop-start, B, 2, g, D] tensor: a view, or a copy where a ring wraps."""
        parts = self.blocks(start, stop)
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def write(self, position: int, block: torch.Tensor, non_blocking: bool = False) -> None:
        """Copies block [n, B, 2, g, D] to tokens [position, position + n), split where a ring wraps."""
        done = 0
        for part in self.blocks(position, position + block.shape[0]):
            part.copy_(block[done : done + part.shape[0]], non_blocking=non_blocking)
            done += part.shape[0]

    def keys(self, start: int, stop: int) -> torch.Tensor:
        """[B, g, stop-start, D] keys (for inspection and tests; the hot path reads blocks)."""
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
                 chunk: int = 4096):
        self._host = host
        self.window = window
        if window is not None:
            capacity = min(capacity, window - 1 + chunk)
        self.homes = [GroupHome(g, self._empty(g, (capacity, batch, 2, g.size, head_dim), dtype, device), window)
                      for g in groups]

    @property
    def chunk_room(self) -> int:
        """The longest chunk a ring can take without overwriting what the chunk itself reads."""
        return self.homes[0].capacity - (self.window - 1) if self.window is not None else 1 << 62

    def has_room(self, length: int, q_len: int) -> bool:
        """Whether ``q_len`` more tokens fit (all homes of a layer share one capacity)."""
        if self.window is not None:
            return q_len <= self.chunk_room
        return length + q_len <= self.homes[0].capacity

    def oldest(self, length: int) -> int:
        """The first token the homes still hold when ``length`` tokens were appended."""
        return max(0, length - self.homes[0].capacity) if self.window is not None else 0

    def _empty(self, group: HeadGroup, shape, dtype, device) -> torch.Tensor:
        if group.is_resident:
            with torch.inference_mode(False):  # written in place later, also outside inference mode
                return torch.empty(shape, dtype=dtype, device=device)
        return self._host.empty(shape, dtype)

    def __iter__(self):
        return iter(self.homes)

    def __len__(self) -> int:
        return len(self.homes)

    def __getitem__(self, index: int) -> GroupHome:
        return self.homes[index]

    def nbytes(self, on_device: bool) -> int:
        return sum(h.nbytes for h in self.homes if (h.device.type != "cpu") == on_device)

    def reserve(self, num_tokens: int, num_valid: int, chunk: int) -> None:
        """Makes room for ``num_tokens`` keeping the first ``num_valid`` (rings: room for a ``chunk``-token
        append); the caller has fenced the copy streams."""
        for home in self.homes:
            if home.is_ring:
                needed = self.window - 1 + chunk
                if needed <= home.capacity:
                    continue
                keep = min(num_valid, home.capacity)
                kept = home.block(num_valid - keep, num_valid).clone()  # in token order
            else:
                if num_tokens <= home.capacity:
                    continue
                needed = max(num_tokens, 2 * home.capacity)
            logger.info("growing KV home of heads %d-%d from %d to %d tokens (plan max_context / chunk_size to "
                        "avoid this)", home.group.start, home.group.stop, home.capacity, needed)
            old = home.kv
            home.kv = self._empty(home.group, (needed, *old.shape[1:]), old.dtype, old.device)
            if home.is_ring:
                home.write(num_valid - keep, kept)
            else:
                home.kv[:num_valid].copy_(old[:num_valid])
            if home.is_host:
                self._host.free(old)

    def set_anchor(self, position: int) -> None:
        """Keeps a copy of the window before ``position`` (rings only), so ``restore_anchor`` can crop back to it."""
        if self.window is None:
            return
        first = max(0, position - (self.window - 1))
        for home in self.homes:
            home.anchor = (position, home.block(first, position).clone())

    def can_crop_to(self, position: int, length: int) -> bool:
        if self.window is None or position == length:
            return True
        first = max(0, position - (self.window - 1))
        return first >= self.oldest(length) or self.homes[0].anchor is not None and self.homes[0].anchor[0] == position

    def crop_to(self, position: int, length: int) -> None:
        """Makes the rings hold the window before ``position`` again (from the anchor if it was overwritten)."""
        if self.window is None or position >= length:
            return
        first = max(0, position - (self.window - 1))
        if first >= self.oldest(length):
            return
        anchor = self.homes[0].anchor
        if anchor is None or anchor[0] != position:
            raise ValueError(f"cannot crop a sliding-window layer back from {length} to {position} tokens: the ring "
                             "no longer holds the window before it (anchor that position first)")
        for home in self.homes:
            home.write(first, home.anchor[1])
