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

Host attention (``host_attention.py``): on a step of at most ``HOST_QUERY_LIMIT`` query tokens (decode, short
follow-ups), the layer's groups in ``host_slots`` are not fetched: their queries go to the host, where a thread
pool attends their homes while this loop streams the others; the layer then waits for both halves. Prefetching
follows the streamed slots only on such steps. Prefill chunks attend every group on the device.
"""

from __future__ import annotations

import torch

from . import kernels
from .homes import LayerHomes
from .host_attention import HostAttention, HostJob
from .probe import QueryProbe
from .transfer import Slot, Transfer

#: Steps with at most this many query tokens may attend offloaded groups on the host: their queries and
#: outputs are a few KB, while a prefill chunk's attention is compute-bound and belongs on the device.
HOST_QUERY_LIMIT = 16


def visible_start(past: int, window: int | None) -> int:
    """First key a chunk starting at position ``past`` can see: with window W, query t sees keys > t - W."""
    return 0 if window is None else max(0, past - window + 1)


class Schedule:
    """Runs each layer's head groups in order and keeps the next offloaded slot in flight."""

    def __init__(self, layers: list[LayerHomes], windows: list[int | None], transfer: Transfer, overlap: bool,
                 host: HostAttention | None = None, host_slots: frozenset[Slot] = frozenset(), disk=None):
        self.layers, self.windows, self.transfer, self.overlap = layers, windows, transfer, overlap
        self.disk = disk  # DiskMemory of the disk tier, for read-ahead
        self.probe: QueryProbe | None = None  # set while an answer's sources are being recorded
        self.host, self.host_slots = host, host_slots if host is not None else frozenset()
        assert all(layers[l][g].is_host for l, g in self.host_slots), "the host attends homes in host memory only"
        offloaded = [(layer_idx, group_idx) for layer_idx, homes in enumerate(layers)
                     for group_idx, home in enumerate(homes) if home.is_host]
        # Successors on steps that fetch every offloaded slot, and on host steps, which fetch the others only.
        self._successor = _successors(layers, offloaded)
        self._streamed_successor = _successors(layers, [s for s in offloaded if s not in self.host_slots])
        self.host_seconds = 0.0  # wall time of host jobs (the layer waits for both halves; meters show it)

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
        is_host_step = bool(self.host_slots) and q_len <= HOST_QUERY_LIMIT
        on_host = [g for g in range(len(homes)) if is_host_step and (layer_idx, g) in self.host_slots]
        # Started first, so the host computes while the loop below streams the other groups.
        job = self._start_host(layer_idx, on_host, queries, start, past + q_len, scaling, window,
                               softcap) if on_host else None
        outs: dict[int, torch.Tensor] = {}
        try:
            for group_idx, home in enumerate(homes):
                if group_idx in on_host:
                    continue
                buffer = None
                try:
                    if home.is_host:
                        buffer = self.transfer.acquire((layer_idx, group_idx), home, start, past, num_past + q_len)
                        block = self.transfer.with_chunk(buffer, num_past, staged[group_idx])
                    else:
                        block = home.block(start, past + q_len)  # the append above already put the chunk there
                        self.transfer.streams.read(block, "a resident home")
                    if self.overlap:
                        self._prefetch_after((layer_idx, group_idx), past, q_len, is_host_step)
                    outs[group_idx] = kernels.attend_block(queries[group_idx], block, q_offset=num_past,
                                                           scaling=scaling, window=window, softcap=softcap)
                finally:
                    if buffer is not None:
                        self.transfer.release(buffer)
        finally:
            if job is not None:
                job.wait()  # workers read the homes and the landed queries: never leave them running
        if job is not None:
            outs.update(zip(on_host, self._finish_host(job).split(queries[0].shape[1], dim=1)))
        out = torch.cat([outs[g] for g in range(len(homes))], dim=1) if len(homes) > 1 else outs[0]  # [B, H, Q, D]
        return out.transpose(1, 2)

    def _start_host(self, layer_idx: int, on_host: list[int], queries, start: int, stop: int, scaling: float,
                    window: int | None, softcap: float | None) -> HostJob:
        transfer = self.transfer
        sent = queries[on_host[0]] if len(on_host) == 1 else torch.cat([queries[g] for g in on_host], dim=1)
        host_query, wait = transfer.to_host(layer_idx, sent)  # [B, Gh * g * n_rep, Q, D]
        out = transfer.host_result(tuple(sent.shape), sent.dtype)
        homes = [self.layers[layer_idx][g] for g in on_host]
        if homes[0].is_ring:
            # The kernel reads token positions straight from a home. A window ring's rows wrap: give it the
            # visible tokens [start, stop) as one tensor instead (at most a window; 8-bit: dequantized), with
            # positions shifted by ``start`` (masks are relative).
            wait()  # the chunk appended this step must have landed before this thread reads it here
            for home in homes:
                for plane in range(len(home.planes)):
                    for part in home.blocks(start, stop, plane):
                        transfer.streams.host_read(part, "a ring home read for host attention")
            kvs = [home.block(start, stop) for home in homes]
            return self.host.start(host_query, kvs, 0, stop - start, scaling=scaling, window=window,
                                   softcap=softcap, ready=None, out=out)
        scales = [home.planes[1] for home in homes] if homes[0].is_quantized else None  # dequantized per tile
        return self.host.start(host_query, [home.kv for home in homes], start, stop, scaling=scaling,
                               window=window, softcap=softcap, ready=wait, scales=scales, out=out)

    def _finish_host(self, job: HostJob) -> torch.Tensor:
        # [B, Gh * g * n_rep, Q, D]: a few KB back to the device, from page-locked memory without blocking
        out = self.transfer.from_host(job.result())
        self.host_seconds += job.seconds
        return out

    def _prefetch_after(self, slot: Slot, past: int, q_len: int, is_host_step: bool) -> None:
        successor = (self._streamed_successor if is_host_step else self._successor).get(slot)
        if successor is None:
            return  # nothing is fetched on such steps
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


def _successors(layers: list[LayerHomes], order: list[Slot]) -> dict[Slot, tuple[Slot, bool]]:
    """Successor of every slot (fetched or not) in forward order: the next slot of ``order``, and whether it
    belongs to the next forward (after the last one, the schedule wraps around)."""
    if not order:
        return {}
    successor = {}
    for slot in [(l, g) for l, homes in enumerate(layers) for g in range(len(homes))]:
        later = next((s for s in order if s > slot), None)
        successor[slot] = (later, False) if later is not None else (order[0], True)
    return successor
