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
    """Storage of one (layer, head group); its layer knows how many tokens are valid."""

    def __init__(self, group: HeadGroup, kv: torch.Tensor):
        assert kv.dim() == 5 and kv.shape[2] == 2 and kv.shape[3] == group.size, tuple(kv.shape)
        self.group = group
        self.kv = kv  # [capacity, B, 2, g, D]
        # Offloaded: in host memory and streamed through the ping-pong buffers. (On a CPU-only machine a
        # resident home is in host memory too, but it is read in place like any resident one.)
        self.is_host = not group.is_resident

    @property
    def capacity(self) -> int:
        return self.kv.shape[0]

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes

    @property
    def device(self) -> torch.device:
        return self.kv.device

    def block(self, start: int, stop: int) -> torch.Tensor:
        """Tokens [start, stop) as a contiguous [stop-start, B, 2, g, D] view."""
        return self.kv[start:stop]

    def keys(self, start: int, stop: int) -> torch.Tensor:
        """[B, g, stop-start, D] view of the keys (for inspection and tests; the hot path reads blocks)."""
        return self.kv[start:stop, :, 0].permute(1, 2, 0, 3)

    def values(self, start: int, stop: int) -> torch.Tensor:
        return self.kv[start:stop, :, 1].permute(1, 2, 0, 3)


class LayerHomes:
    """All head groups of one layer: offloaded ones from ``host``, resident ones on ``device``."""

    def __init__(self, groups: list[HeadGroup], batch: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device: torch.device, host: HostMemory):
        self._host = host
        self.homes = [GroupHome(g, self._empty(g, (capacity, batch, 2, g.size, head_dim), dtype, device))
                      for g in groups]

    def _empty(self, group: HeadGroup, shape, dtype, device) -> torch.Tensor:
        if group.is_resident:
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

    def reserve(self, num_tokens: int, num_valid: int) -> None:
        """Makes room for ``num_tokens`` keeping the first ``num_valid``; the caller has fenced the copy streams."""
        for home in self.homes:
            if num_tokens <= home.capacity:
                continue
            new_capacity = max(num_tokens, 2 * home.capacity)
            logger.info("growing KV home of heads %d-%d from %d to %d tokens (plan max_context to avoid this)",
                        home.group.start, home.group.stop, home.capacity, new_capacity)
            old = home.kv
            new = self._empty(home.group, (new_capacity, *old.shape[1:]), old.dtype, old.device)
            new[:num_valid].copy_(old[:num_valid])
            home.kv = new
            if home.is_host:
                self._host.free(old)
