"""Where a layer's KV cache lives: one contiguous home per (layer, head group).

A home is ``[g, B, capacity, D]`` for K and for V, so each KV head's tokens are one contiguous run
(``home[i, b]``) and a fetch or an append is a plain contiguous copy per head. Offloaded homes live
in (pinned) host memory; resident homes live on the compute device. Capacity is pre-allocated from
the plan and only grows (doubling, logged) if a caller goes past it.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

import torch

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
    """Storage for one (layer, head group); its layer knows how many tokens are valid."""

    def __init__(self, group: HeadGroup, batch: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device: torch.device, pin_memory: bool):
        self.group = group
        self._pin = pin_memory and device.type == "cpu" and torch.cuda.is_available()
        shape = (group.size, batch, capacity, head_dim)
        self.keys = _empty(shape, dtype, device, self._pin)
        self.values = _empty(shape, dtype, device, self._pin)

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes

    @property
    def device(self) -> torch.device:
        return self.keys.device

    def reserve(self, num_tokens: int, num_valid: int) -> None:
        """Makes room for ``num_tokens`` tokens keeping the first ``num_valid``; pending copies are synchronised."""
        if num_tokens <= self.capacity:
            return
        new_capacity = max(num_tokens, 2 * self.capacity)
        logger.info("growing KV home of heads %d-%d from %d to %d tokens (pre-allocate with max_context to avoid this)",
                    self.group.start, self.group.stop, self.capacity, new_capacity)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = _empty((*old.shape[:2], new_capacity, old.shape[3]), old.dtype, old.device, self._pin)
            new[:, :, :num_valid].copy_(old[:, :, :num_valid])
            setattr(self, name, new)

    def write(self, key: torch.Tensor, value: torch.Tensor, position: int) -> None:
        """Copies new tokens of this group's heads into the home at ``position``.

        key/value: [B, KVH, Q, D] contiguous, for all KV heads of the layer (this group slices its own).
        Called on whatever stream the caller chose; each copy is contiguous on both sides.
        """
        batch, _, q_len, _ = key.shape
        non_blocking = self.keys.is_pinned() or self.device.type == "cuda"
        for i, head in enumerate(range(self.group.start, self.group.stop)):
            for b in range(batch):
                self.keys[i, b, position : position + q_len].copy_(key[b, head], non_blocking=non_blocking)
                self.values[i, b, position : position + q_len].copy_(value[b, head], non_blocking=non_blocking)

    def view(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens [start, stop) as [B, g, stop-start, D] views (no copy)."""
        return (self.keys[:, :, start:stop].transpose(0, 1), self.values[:, :, start:stop].transpose(0, 1))


class LayerStore:
    """All head groups of one layer; the unit the cache layer appends to and the attention reads from."""

    def __init__(self, groups: list[HeadGroup], batch: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, compute_device: torch.device, pin_memory: bool):
        host = torch.device("cpu")
        self.homes = [
            GroupHome(g, batch, head_dim, capacity, dtype, compute_device if g.is_resident else host, pin_memory)
            for g in groups
        ]

    def nbytes(self, on_device: bool) -> int:
        return sum(h.nbytes for h in self.homes if (h.device.type != "cpu") == on_device)


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, pin: bool) -> torch.Tensor:
    if not pin:
        return torch.empty(shape, dtype=dtype, device=device)
    return pinned_empty(shape, dtype)


def pinned_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Page-locked host tensor of exactly its size.

    torch's pinned allocator rounds every block up to a power of two, which can double the host RAM a
    large KV home takes; registering ordinary memory with ``cudaHostRegister`` locks exactly what is used.
    Falls back to the pinned allocator if registration is refused.
    """
    tensor = torch.empty(shape, dtype=dtype)
    if tensor.nbytes == 0:
        return tensor
    cudart = torch.cuda.cudart()
    error = cudart.cudaHostRegister(tensor.data_ptr(), tensor.nbytes, 0)
    if int(error) != 0:
        logger.warning("cudaHostRegister failed (%s); using torch's pinned allocator", error)
        return torch.empty(shape, dtype=dtype, pin_memory=True)
    # Unlock when the tensor object goes; homes are only dropped after their copies are synchronised.
    weakref.finalize(tensor, cudart.cudaHostUnregister, tensor.data_ptr())
    return tensor
