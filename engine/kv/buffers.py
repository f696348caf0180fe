"""The device-side buffers a ``Transfer`` owns, and how they are made.

All token-major like the homes (see ``homes.py``):
- *staging* buffers ``[G, Q, B, 2, g, D]``: a chunk's K/V in home layout, written once per layer on the compute
  stream, read by the appends (d2h) and by the copies into the ping-pong buffers (compute);
- *ping-pong* buffers ``[capacity, B, 2, g, D]``: one being attended, one being filled;
- for 8-bit homes, code and scale planes beside each (``quant.py``).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from . import quant
from .ledger import CODES, PINGPONG, STAGING, Ledger

Slot = tuple[int, int]  # (layer index, head-group index)


@dataclass
class PingPong:
    kv: torch.Tensor  # [capacity, B, 2, g, D] on the compute device
    ready: object  # event (``streams.py``): recorded on h2d when its fetch has landed
    free: object  # event: recorded on compute when attention stopped reading it
    is_used: bool = False  # acquired and not yet released
    pending: Slot | None = None  # fetched (or being fetched) for this slot, not yet acquired
    start: int = 0
    stop: int = 0
    free_recorded: bool = False
    codes: list[torch.Tensor] | None = None  # 8-bit homes land here ([codes, scales]), then dequantize into kv
    is_coded: bool = False  # the last fetch landed in ``codes`` and still needs dequantizing
    disk_job: Future | None = None  # a disk home's fetch on the disk stream's worker: joined before ``ready``


@dataclass
class Staging:
    flat: torch.Tensor  # capacity * G * B * 2 * g * D elements on the compute device
    produced: object  # event: recorded on compute after the chunk was written
    free: object  # event: recorded on d2h after the appends read it
    free_recorded: bool = False
    codes: list[torch.Tensor] | None = None  # the chunk quantized for 8-bit homes: [codes, scales] flat


@dataclass
class Appends:
    """The last two d2h appends of one layer: (first token position, event), oldest first."""

    events: tuple
    entries: list = field(default_factory=list)
    turn: int = 0


@dataclass(frozen=True)
class BufferFactory:
    """Makes the buffers of one cache's shapes: ``group_shape`` is (B, g, D) of one head group.

    Buffers are created outside inference mode (by the ledger), so generate() (no_grad) may write them after an
    inference-mode forward allocated them."""

    device: torch.device
    group_shape: tuple[int, int, int]
    num_groups: int
    dtype: torch.dtype
    kv_dtype: str | None
    ledger: Ledger = field(default_factory=Ledger)  # the cache's allocation point (``ledger.py``)

    def pingpong(self, tokens: int) -> torch.Tensor:
        batch, g, head_dim = self.group_shape
        return self.ledger.empty(PINGPONG, (max(tokens, 1), batch, 2, g, head_dim), self.dtype, self.device)

    def codes(self, rows: int) -> list[torch.Tensor] | None:
        """[rows, B, 2, g, D] codes and [rows, B, 2, g, 1] scales for 8-bit homes; None without them."""
        if self.kv_dtype is None:
            return None
        batch, g, head_dim = self.group_shape
        shape = (max(rows, 1), batch, 2, g)
        return [self.ledger.empty(CODES, (*shape, head_dim), quant.storage_dtype(self.kv_dtype), self.device),
                self.ledger.empty(CODES, (*shape, 1), quant.SCALE_DTYPE, self.device)]

    def staging(self, tokens: int) -> torch.Tensor:
        batch, g, head_dim = self.group_shape
        numel = max(tokens, 1) * batch * 2 * g * self.num_groups * head_dim
        return self.ledger.empty(STAGING, (numel,), self.dtype, self.device)


def copy_parts(copy, target: torch.Tensor, parts: list[torch.Tensor], what: str = "") -> None:
    """Copies consecutive parts (one, or two where a ring wraps) into the rows of ``target`` in order, with
    ``copy(dst, src, what)`` (the streams seam's, on its current stream)."""
    done = 0
    for part in parts:
        copy(target[done : done + part.shape[0]], part, what)
        done += part.shape[0]
