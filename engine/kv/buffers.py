"""The device-side buffers a ``Transfer`` owns, and how they are made.

All token-major like the homes (see ``homes.py``):
- *staging* buffers ``[G, Q, B, 2, g, D]``: a chunk's K/V in home layout, written once per layer on the compute
  stream, read by the appends (d2h) and by the copies into the ping-pong buffers (compute);
- *ping-pong* buffers ``[capacity, B, 2, g, D]``: one being attended, one being filled; ``capacity`` is the plan's
  ``groups_per_buffer`` times a group's visible context, so one holds a run of that many adjacent groups
  (``PingPong.run_views``; more at a shorter context), fetched and attended together;
- for 8-bit homes, code and scale planes beside each (``quant.py``);
- the attention *scratch* (CUDA): one flat buffer that SDPA's fused kernels read a block's K/V from, copied
  contiguous (``Scratch``), sized for a whole ping-pong buffer's run. Allocated once at its planned size: a fresh
  copy per call grew with the context chunk by chunk, and the caching allocator kept every size it had handed out
  (the first GPU run reserved 25.68e9 bytes for a 23.59e9-byte plan).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from . import quant
from .ledger import CODES, PINGPONG, SCRATCH, STAGING, Ledger

logger = logging.getLogger(__name__)

Slot = tuple[int, int]  # (layer index, head-group index)


class Run(NamedTuple):
    """Adjacent head groups ``[first, first + num)`` of one layer, fetched and attended together (``num`` 1: a slot)."""

    layer: int
    first: int
    num: int = 1


@dataclass
class PingPong:
    kv: torch.Tensor  # [capacity, B, 2, g, D] on the compute device
    ready: object  # event (``streams.py``): recorded on h2d when its fetch has landed
    free: object  # event: recorded on compute when attention stopped reading it
    is_used: bool = False  # acquired and not yet released
    pending: Run | None = None  # fetched (or being fetched) for this run, not yet acquired
    start: int = 0
    stop: int = 0
    free_recorded: bool = False
    codes: list[torch.Tensor] | None = None  # 8-bit homes land here ([codes, scales]), then dequantize into kv
    is_coded: bool = False  # the last fetch landed in ``codes`` and still needs dequantizing
    disk_job: Future | None = None  # a disk home's fetch on the disk stream's worker: joined before ``ready``
    num: int = 1  # head groups of the run it holds (the last fetch's)
    views: dict = field(default_factory=dict)  # groups in a run -> its views (``run_views``); reset when regrown

    def run_views(self, num: int) -> tuple[torch.Tensor, list[torch.Tensor] | None, torch.Tensor]:
        """The buffer as ``num`` groups of ``rows // num`` tokens each: ``[num, rows // num, B, 2, g, D]`` (and the
        code planes alike), and (batch 1) what attention reads: ``[rows // num, num, 2, g, D]``, the groups as the
        batch, or for groups of one head ``[rows // num, 1, 2, num, D]``, the groups as the heads of one sequence.
        Each group's rows are contiguous, so a fetch lands one copy per group, and the run is attended in one call.
        Made once per size and kept (a decode step reuses them in every layer)."""
        views = self.views.get(num)
        if views is None:
            rows = self.kv.shape[0] // num
            kv = self.kv[: num * rows].view(num, rows, *self.kv.shape[1:])
            codes = [c[: num * rows].view(num, rows, *c.shape[1:]) for c in self.codes] if self.codes else None
            if kv.shape[4] == 1:  # [n, rows, 1, 2, 1, D] -> [rows, 1, 2, n, D] (a strided view: no copy)
                attended = kv.permute(1, 2, 3, 4, 0, 5).flatten(3, 4)
            else:  # [n, rows, 1, 2, g, D] -> [rows, n, 2, g, D]
                attended = kv.select(2, 0).transpose(0, 1)
            assert attended.data_ptr() == kv.data_ptr(), "a run's attention view must not be a copy"
            views = self.views[num] = (kv, codes, attended)
        return views


@dataclass
class Staging:
    flat: torch.Tensor  # capacity * G * B * 2 * g * D elements on the compute device
    produced: object  # event: recorded on compute after the chunk was written
    free: object  # event: recorded on d2h after the appends read it
    free_recorded: bool = False
    codes: list[torch.Tensor] | None = None  # the chunk quantized for 8-bit homes: [codes, scales] flat
    views: dict = field(default_factory=dict)  # chunk length -> its views (``chunk_views``); reset when regrown

    def chunk_views(self, num_groups: int, q_len: int, row: tuple[int, ...]):
        """A chunk of ``q_len`` tokens in home layout, ``[G, Q, *row]`` (row: B, 2, g, D), the same memory seen as
        ``[2, B, G, g, Q, D]`` (what stacking K and V writes) and the code planes ``[G, Q, ...]`` (8-bit homes).
        Made once per length and kept: a decode step reuses them in every layer."""
        views = self.views.get(q_len)
        if views is None:
            if len(self.views) >= 8:  # (prefill chunks of many lengths: keep the few in use)
                self.views.clear()
            out = self.flat[: q_len * num_groups * math.prod(row)].view(num_groups, q_len, *row)
            codes = [c[: num_groups * q_len].view(num_groups, q_len, *c.shape[1:]) for c in self.codes] \
                if self.codes else None
            views = self.views[q_len] = (out, out.permute(3, 2, 0, 4, 1, 5), codes)
        return views


class Scratch:
    """The one owner of a cache's attention scratch: ``flat`` holds at most ``[2, B, H, K, D]`` (K and V of the
    block being attended, contiguous). Every call writes views of it from the start, so it is never re-allocated
    while the calls stay within the plan; a larger call (a forward longer than the planned chunk, homes grown
    past an unplanned context) replaces it by one of that size, logged. Written and read on the compute stream
    only, one attention call at a time: no event guards it."""

    def __init__(self, make: Callable[[int], torch.Tensor], elements: int):
        self._make = make  # elements -> a flat buffer, recorded by the ledger (``BufferFactory.scratch``)
        self.flat = make(elements)

    def kv(self, key: torch.Tensor, value: torch.Tensor, expand: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """key/value: [B, Hk, K, D] (any strides) -> contiguous views [B, Hk * expand, K, D] of this buffer, every KV
        head repeated ``expand`` times in a row (what ``repeat_interleave(expand, dim=1)`` gives)."""
        batch, num_heads, keys, head_dim = key.shape
        numel = 2 * batch * num_heads * expand * keys * head_dim
        if numel > self.flat.numel():
            logger.info("growing the attention scratch from %d to %d elements", self.flat.numel(), numel)
            self.flat = None  # the old one goes first (nothing else reads it between calls)
            self.flat = self._make(numel)
        out = self.flat[:numel].view(2, batch, num_heads, expand, keys, head_dim)
        out[0].copy_(key.unsqueeze(2))  # [B, Hk, 1, K, D] broadcast over the expand axis
        out[1].copy_(value.unsqueeze(2))
        kv = out.view(2, batch, num_heads * expand, keys, head_dim)
        return kv[0], kv[1]


def contiguous_kv(key: torch.Tensor, value: torch.Tensor, expand: int = 1,
                  scratch: Scratch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, Hk, K, D] (strided views) -> contiguous [B, Hk * expand, K, D] each, every KV head repeated ``expand``
    times in a row: views of ``scratch`` when given, else newly allocated (attention outside a cache)."""
    if scratch is not None:
        if (key.dtype, key.device) == (scratch.flat.dtype, scratch.flat.device):
            return scratch.kv(key, value, expand)
        # (not expected: the cache allocates it in the dtype and on the device its K/V come in; exact either way)
        logger.warning("attention scratch is %s on %s, the keys %s on %s: copying outside it", scratch.flat.dtype,
                       scratch.flat.device, key.dtype, key.device)
    if expand > 1:
        return key.repeat_interleave(expand, dim=1), value.repeat_interleave(expand, dim=1)
    return key.contiguous(), value.contiguous()


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

    def scratch(self, elements: int) -> torch.Tensor:
        """The attention scratch's flat buffer (``Scratch``), in the compute dtype."""
        return self.ledger.empty(SCRATCH, (max(elements, 1),), self.dtype, self.device)

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
