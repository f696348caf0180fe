"""The device-side buffers a ``Transfer`` owns, and how they are made.

All token-major like the homes (see ``homes.py``):
- *staging* buffers ``[G, Q, B, 2, g, D]``: a chunk's K/V in home layout, written once per layer on the compute
  stream, read by the appends (d2h) and by the copies into the ping-pong buffers (compute);
- *ping-pong* buffers ``[capacity, B, 2, g, D]``: one being attended, one being filled; ``capacity`` is the plan's
  ``groups_per_buffer`` times a group's visible context, so one holds a run of that many adjacent groups
  (``PingPong.run_views``; more at a shorter context), fetched and attended together;
- for 8-bit homes, code and scale planes beside each (``quant.py``);
- models whose layers differ in KV shape (Gemma 4's global layers: their own head_dim and KV heads): each buffer is
  allocated flat at the largest layer's size and seen per layer's shape (``PingPong.shaped``, ``Staging.chunk_views``),
  a layer of a smaller head_dim holding more rows;
- the attention *scratch* (CUDA): one flat buffer that SDPA's fused kernels read a block's K/V from, copied
  contiguous (``Scratch``), sized for a whole ping-pong buffer's run. Allocated once at its planned size: a fresh
  copy per call grew with the context chunk by chunk, and the caching allocator kept every size it had handed out
  (the first GPU lease reserved 25.68e9 bytes for a 23.59e9-byte plan).
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
    flat: torch.Tensor  # the buffer's elements on the compute device, seen as [rows, B, 2, g, D] by ``shaped``
    ready: object  # event (``streams.py``): recorded on h2d when its fetch has landed
    free: object  # event: recorded on compute when attention stopped reading it
    is_used: bool = False  # acquired and not yet released
    pending: Run | None = None  # fetched (or being fetched) for this run, not yet acquired
    start: int = 0
    stop: int = 0
    free_recorded: bool = False
    codes: list[torch.Tensor] | None = None  # 8-bit homes land here ([codes, scales], flat), then dequantize into kv
    is_coded: bool = False  # the last fetch landed in ``codes`` and still needs dequantizing
    disk_job: Future | None = None  # a disk home's fetch on the disk stream's worker: joined before ``ready``
    num: int = 1  # head groups of the run it holds (the last fetch's)
    row: tuple[int, ...] = ()  # (B, 2, g, D) of one token of one group of the layer it last held
    views: dict = field(default_factory=dict)  # (row, groups in a run) -> its views; reset when regrown

    @property
    def kv(self) -> torch.Tensor:
        """The buffer as its last layer's rows, ``[rows, B, 2, g, D]``."""
        return self.shaped(self.row)[0]

    def rows(self, row: tuple[int, ...]) -> int:
        """Token rows of one group of shape ``row`` (B, 2, g, D) the buffer holds."""
        return self.shaped(row)[0].shape[0]

    def shaped(self, row: tuple[int, ...]) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """The buffer as rows of ``row``: ``[rows, B, 2, g, D]`` and (8-bit) the codes ``[rows, B, 2, g, D]`` and
        scales ``[rows, B, 2, g, 1]``; made once per row shape and kept."""
        views = self.views.get(row)
        if views is None:
            per_row, scales_row = math.prod(row), math.prod(row[:-1])
            rows = self.flat.numel() // per_row
            if self.codes:
                rows = min(rows, self.codes[0].numel() // per_row, self.codes[1].numel() // scales_row)
            kv = self.flat[: rows * per_row].view(rows, *row)
            codes = [self.codes[0][: rows * per_row].view(rows, *row),
                     self.codes[1][: rows * scales_row].view(rows, *row[:-1], 1)] if self.codes else None
            views = self.views[row] = (kv, codes)
        return views

    def run_views(self, num: int, row: tuple[int, ...] | None = None):
        """The buffer as ``num`` groups of ``rows // num`` tokens each: ``[num, rows // num, B, 2, g, D]`` (and the
        code planes alike), and (batch 1) what attention reads: ``[rows // num, num, 2, g, D]``, the groups as the
        batch, or for groups of one head ``[rows // num, 1, 2, num, D]``, the groups as the heads of one sequence.
        Each group's rows are contiguous, so a fetch lands one copy per group, and the run is attended in one call.
        Made once per size and kept (a decode step reuses them in every layer). ``row``: the layer's (B, 2, g, D);
        default the last fetch's."""
        row = self.row if row is None else row
        views = self.views.get((row, num))
        if views is None:
            whole, planes = self.shaped(row)
            rows = whole.shape[0] // num
            kv = whole[: num * rows].view(num, rows, *whole.shape[1:])
            codes = [c[: num * rows].view(num, rows, *c.shape[1:]) for c in planes] if planes else None
            if kv.shape[4] == 1:  # [n, rows, 1, 2, 1, D] -> [rows, 1, 2, n, D] (a strided view: no copy)
                attended = kv.permute(1, 2, 3, 4, 0, 5).flatten(3, 4)
            else:  # [n, rows, 1, 2, g, D] -> [rows, n, 2, g, D]
                attended = kv.select(2, 0).transpose(0, 1)
            assert attended.data_ptr() == kv.data_ptr(), "a run's attention view must not be a copy"
            views = self.views[(row, num)] = (kv, codes, attended)
        return views


@dataclass
class Staging:
    flat: torch.Tensor  # capacity * G * B * 2 * g * D elements on the compute device
    produced: object  # event: recorded on compute after the chunk was written
    free: object  # event: recorded on d2h after the appends read it
    free_recorded: bool = False
    codes: list[torch.Tensor] | None = None  # the chunk quantized for 8-bit homes: [codes, scales] flat
    views: dict = field(default_factory=dict)  # (groups, length, row) -> its views (``chunk_views``); reset when regrown

    def chunk_views(self, num_groups: int, q_len: int, row: tuple[int, ...]):
        """A chunk of ``q_len`` tokens in home layout, ``[G, Q, *row]`` (row: B, 2, g, D), the same memory seen as
        ``[2, B, G, g, Q, D]`` (what stacking K and V writes) and the code planes ``[G, Q, ...]`` (8-bit homes).
        Made once per layer shape and length and kept: a decode step reuses them in every layer."""
        key = (num_groups, q_len, row)
        views = self.views.get(key)
        if views is None:
            if len(self.views) >= 8:  # (prefill chunks of many lengths: keep the few in use)
                self.views.clear()
            out = self.flat[: q_len * num_groups * math.prod(row)].view(num_groups, q_len, *row)
            codes = [self.codes[0][: out.numel()].view(out.shape),
                     self.codes[1][: out.numel() // row[-1]].view(*out.shape[:-1], 1)] if self.codes else None
            views = self.views[key] = (out, out.permute(3, 2, 0, 4, 1, 5), codes)
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
    next_event: int = 0  # which of ``events`` the next append records


@dataclass(frozen=True)
class BufferFactory:
    """Makes the buffers of one cache's shapes: ``group_shape`` is (B, g, D) of one head group, ``num_groups`` the
    groups of a layer; where layers differ (``layers``: each one's (groups, D)), the largest of each.

    Every buffer is flat: its users see it as their layer's shape (``PingPong.shaped``, ``Staging.chunk_views``).
    Buffers are created outside inference mode (by the ledger), so generate() (no_grad) may write them after an
    inference-mode forward allocated them."""

    device: torch.device
    group_shape: tuple[int, int, int]
    num_groups: int
    dtype: torch.dtype
    kv_dtype: str | None
    ledger: Ledger = field(default_factory=Ledger)  # the cache's allocation point (``ledger.py``)
    layers: tuple[tuple[int, int], ...] = ()  # (groups, head_dim) of each layer; empty: all alike

    @property
    def row_elements(self) -> int:
        """Elements of one token of one group at the largest head_dim: B x 2 x g x D."""
        batch, g, head_dim = self.group_shape
        return batch * 2 * g * head_dim

    @property
    def _token_elements(self) -> int:
        """Elements of one token of the layer with the most (K and V of every group): what staging holds a token."""
        batch, g, head_dim = self.group_shape
        largest = max((groups * dim for groups, dim in self.layers), default=self.num_groups * head_dim)
        return batch * 2 * g * largest

    def pingpong(self, tokens: int) -> torch.Tensor:
        """A ping-pong buffer of ``tokens`` rows of one group at the largest head_dim (flat)."""
        return self.ledger.empty(PINGPONG, (max(tokens, 1) * self.row_elements,), self.dtype, self.device)

    def codes(self, tokens: int) -> list[torch.Tensor] | None:
        """A ping-pong buffer's 8-bit planes, flat: codes of ``tokens`` rows at the largest head_dim, and one scale
        per (token, K or V, head) of as many rows at the smallest (its view holds the most); None without them."""
        if self.kv_dtype is None:
            return None
        batch, g, head_dim = self.group_shape
        smallest = min((dim for _, dim in self.layers), default=head_dim)
        numel = max(tokens, 1) * self.row_elements
        return [self.ledger.empty(CODES, (numel,), quant.storage_dtype(self.kv_dtype), self.device),
                self.ledger.empty(CODES, (numel // smallest,), quant.SCALE_DTYPE, self.device)]

    def staging_codes(self, tokens: int) -> list[torch.Tensor] | None:
        """A staging buffer's 8-bit planes, flat: codes of ``tokens`` tokens of the largest layer, their scales."""
        if self.kv_dtype is None:
            return None
        batch, g, _ = self.group_shape
        groups = max((groups for groups, _ in self.layers), default=self.num_groups)
        return [self.ledger.empty(CODES, (max(tokens, 1) * self._token_elements,), quant.storage_dtype(self.kv_dtype),
                                  self.device),
                self.ledger.empty(CODES, (max(tokens, 1) * groups * batch * 2 * g,), quant.SCALE_DTYPE, self.device)]

    def scratch(self, elements: int) -> torch.Tensor:
        """The attention scratch's flat buffer (``Scratch``), in the compute dtype."""
        return self.ledger.empty(SCRATCH, (max(elements, 1),), self.dtype, self.device)

    def staging(self, tokens: int) -> torch.Tensor:
        numel = max(tokens, 1) * self._token_elements
        return self.ledger.empty(STAGING, (numel,), self.dtype, self.device)


def copy_parts(copy, target: torch.Tensor, parts: list[torch.Tensor], what: str = "") -> None:
    """Copies consecutive parts (one, or two where a ring wraps) into the rows of ``target`` in order, with
    ``copy(dst, src, what)`` (the streams seam's, on its current stream)."""
    done = 0
    for part in parts:
        copy(target[done : done + part.shape[0]], part, what)
        done += part.shape[0]
