"""The overlap schedule: one loop over a layer's head groups, the only place that orders KV movement.

For a chunk of Q query tokens at positions [past, past + Q) of layer L:

    append: stage the chunk's K/V in home layout; copy it into every home (host homes on the d2h stream)
    attend: for each head group g of L:
        K/V of g <- its resident home, or the ping-pong buffer fetched for it (+ this chunk copied after it)
        start fetching the next offloaded slot (L, g+1), (L+1, first), ... or, after the forward's last one,
            the first offloaded slot of the *next* forward, into the other buffer
        attend(queries of g, K/V of g)
        release g's buffer (even when attention raised)

A fetch reads only tokens below ``past``, so it never waits for this chunk's append: h2d and d2h run at once.
"""

from __future__ import annotations

import torch

from . import kernels
from .homes import LayerHomes
from .probe import QueryProbe
from .transfer import Slot, Transfer


def visible_start(past: int, window: int | None) -> int:
    """First key a chunk starting at position ``past`` can see: with window W, query t sees keys > t - W."""
    return 0 if window is None else max(0, past - window + 1)


class Schedule:
    """Runs each layer's head groups in order and keeps the next offloaded slot in flight."""

    def __init__(self, layers: list[LayerHomes], windows: list[int | None], transfer: Transfer, overlap: bool,
                 disk=None):
        self.layers, self.windows, self.transfer, self.overlap = layers, windows, transfer, overlap
        self.disk = disk  # DiskMemory of the disk tier, for read-ahead
        self.probe: QueryProbe | None = None  # set while an answer's sources are being recorded
        order = [(layer_idx, group_idx) for layer_idx, homes in enumerate(layers)
                 for group_idx, home in enumerate(homes) if home.is_host]
        # Successor of every slot (resident ones too) in forward order: the next offloaded slot, and whether it
        # belongs to the next forward (after the last offloaded slot, the schedule wraps around).
        self._successor: dict[Slot, tuple[Slot, bool]] = {}
        if order:
            slots = [(l, g) for l, homes in enumerate(layers) for g in range(len(homes))]
            for slot in slots:
                later = next((s for s in order if s > slot), None)
                self._successor[slot] = (later, False) if later is not None else (order[0], True)

    def append(self, layer_idx: int, past: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Stores this chunk (key/value: [B, KVH, Q, D]) at [past, past + Q) of every home of the layer.

        Returns the staged chunk, G x [Q, B, 2, g, D], valid until the next layer's append but one.
        """
        index, staged = self.transfer.stage(key, value)
        self.transfer.append(layer_idx, self.layers[layer_idx], staged, index, past)
        return staged

    def attend(self, layer_idx: int, past: int, query: torch.Tensor, staged: tuple[torch.Tensor, ...], *,
               scaling: float, window: int | None, softcap: float | None) -> torch.Tensor:
        """One layer of head-wise attention; the chunk at [past, past + Q) was appended (``staged``).

        query: [B, H, Q, D]. Returns [B, Q, H, D].
        """
        homes = self.layers[layer_idx]
        q_len = query.shape[2]
        if self.probe is not None:
            self.probe.record(layer_idx, past, query, scaling)
        start = visible_start(past, window)
        num_past = past - start
        queries = query.split(query.shape[1] // len(homes), dim=1)  # G x [B, g * n_rep, Q, D]
        outs = []
        for group_idx, home in enumerate(homes):
            buffer = None
            try:
                if home.is_host:
                    buffer = self.transfer.acquire((layer_idx, group_idx), home, start, past, num_past + q_len)
                    block = self.transfer.with_chunk(buffer, num_past, staged[group_idx])
                else:
                    block = home.block(start, past + q_len)  # the append above already put the chunk there
                if self.overlap:
                    self._prefetch_after((layer_idx, group_idx), past, q_len)
                outs.append(kernels.attend_block(queries[group_idx], block, q_offset=num_past, scaling=scaling,
                                                 window=window, softcap=softcap))
            finally:
                if buffer is not None:
                    self.transfer.release(buffer)
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)  # [B, H, Q, D]
        return out.transpose(1, 2)

    def _prefetch_after(self, slot: Slot, past: int, q_len: int) -> None:
        successor = self._successor.get(slot)
        if successor is None:
            return  # nothing is offloaded
        (layer_idx, group_idx), is_next_forward = successor
        if is_next_forward:
            past += q_len  # the next forward starts where this one ends; its length is not known yet
            q_len = 1
        start = visible_start(past, self.windows[layer_idx])
        home = self.layers[layer_idx][group_idx]
        self.transfer.prefetch((layer_idx, group_idx), home, start, past, past - start + q_len)
        if self.disk is not None:
            # One slot further: the kernel reads a disk home's pages while the next slot's copy and compute run.
            (layer_after, group_after), wraps = self._successor[(layer_idx, group_idx)]
            home_after = self.layers[layer_after][group_after]
            if home_after.group.is_on_disk and not (wraps and is_next_forward):
                start_after = visible_start(past, self.windows[layer_after])
                for plane in range(len(home_after.planes)):
                    for part in home_after.blocks(start_after, past, plane):
                        self.disk.read_ahead(part)
