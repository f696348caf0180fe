"""The overlap schedule: one loop over a layer's head groups, the only place that orders KV movement.

For a chunk of Q query tokens at positions [past, past + Q) of layer L:

    append: stage the chunk's K/V in home layout; copy it into every home (host homes on the d2h stream, the
            layer's stacked RAM homes with one batched copy)
    attend: for each unit u of L (a run of adjacent streamed groups, or one resident / disk group):
        K/V of u <- its resident home, or the ping-pong buffer fetched for it (+ this chunk copied after it)
        start fetching the next run: (L, u+1), (L+1, first), ... or, after the forward's last one,
            the first run of the *next* forward, into the other buffer
        attend(queries of u, K/V of u)
        release u's buffer (even when attention raised)

A run holds as many adjacent groups as one ping-pong buffer fits at this length (``units``): each buffer holds the
plan's ``groups_per_buffer`` groups' visible context (``Plan.groups_per_buffer``), so up to the planned context a
run is that many groups, and more at a shorter one (with buffers of one group, one group near the plan). A fetch reads only tokens below ``past``, so it never
waits for this chunk's append: h2d and d2h run at once.

Host attention (``host_attention.py``): on a step of at most ``HOST_QUERY_LIMIT`` query tokens (decode, short
follow-ups), the layer's groups in ``host_slots`` are not fetched: their queries go to the host, where a thread
pool attends their homes while this loop streams the others; the layer then waits for both halves. Prefetching
follows the streamed slots only on such steps. Prefill chunks attend every group on the device.
"""

from __future__ import annotations

import itertools

import torch

from . import kernels
from .homes import LayerHomes
from .host_attention import HostAttention, HostJob
from .probe import QueryProbe
from .transfer import Run, Slot, Transfer

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
        # The layers with a fetched group: on steps that fetch every offloaded slot (False), and on host steps (True),
        # which fetch the others only.
        self._fetching = {is_host_step: [layer_idx for layer_idx, homes in enumerate(layers) if any(
                              home.is_host and not (is_host_step and (layer_idx, g) in self.host_slots)
                              for g, home in enumerate(homes))]
                          for is_host_step in (False, True)}
        self._units: dict[tuple[int, int, bool], list[Run]] = {}
        self.host_seconds = 0.0  # wall time of host jobs (the layer waits for both halves; meters show it)

    def append(self, layer_idx: int, past: int, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """Stores this chunk (key/value: [B, KVH, Q, D]) at [past, past + Q) of every home of the layer.

        Returns the staged chunk, [G, Q, B, 2, g, D], valid until the next layer's append but one.
        """
        index, staged = self.transfer.stage(key, value, layer_idx)
        self.transfer.append(layer_idx, self.layers[layer_idx], staged, index, past)
        return staged

    def attend(self, layer_idx: int, past: int, query: torch.Tensor, staged: torch.Tensor, *,
               scaling: float, window: int | None, softcap: float | None, record: bool = True) -> torch.Tensor:
        """One layer of head-wise attention; the chunk at [past, past + Q) was appended (``staged``).

        query: [B, H, Q, D]. Returns [B, Q, H, D]. ``record``: hand the queries to the probe (not a KV-sharing
        consumer's, which are not this layer's own).
        """
        homes = self.layers[layer_idx]
        batch, num_heads, q_len, head_dim = query.shape
        heads = num_heads // len(homes)  # query heads per group
        if self.probe is not None and record:
            self.probe.record(layer_idx, past, query, scaling)
        start = visible_start(past, window)
        num_past = past - start
        is_host_step = bool(self.host_slots) and q_len <= HOST_QUERY_LIMIT
        on_host = [g for g in range(len(homes)) if is_host_step and (layer_idx, g) in self.host_slots]
        # Started first, so the host computes while the loop below streams the other groups.
        job = self._start_host(layer_idx, on_host, query.split(heads, dim=1), start, past + q_len, scaling, window,
                               softcap) if on_host else None
        units = self.units(layer_idx, num_past + q_len, is_host_step, batch)
        outs: list[tuple[int, torch.Tensor]] = []  # (first group, [B, n * heads, Q, D])
        try:
            for index, run in enumerate(units):
                buffer = None
                queries = query if run.num == len(homes) else query.narrow(1, run.first * heads, run.num * heads)
                try:
                    if homes[run.first].is_host:
                        buffer = self.transfer.acquire(run, homes, start, past, num_past + q_len)
                        if run.num == 1:
                            chunk = staged[run.first]
                        else:
                            chunk = staged if run.num == len(homes) else staged.narrow(0, run.first, run.num)
                        block = self.transfer.with_chunk(buffer, num_past, chunk)
                        if block.shape[1] != batch:  # the run's groups as the batch: [n, heads, Q, D] queries
                            queries = queries.view(run.num, heads, q_len, head_dim)
                    else:
                        block = homes[run.first].block(start, past + q_len)  # the append put the chunk there
                        self.transfer.streams.read(block, "a resident home")
                    if self.overlap:
                        self._prefetch_after(run, index, past, q_len, is_host_step, batch)
                    out = kernels.attend_span(queries, block, q_offset=num_past, scaling=scaling, window=window,
                                               softcap=softcap, scratch=self.transfer.scratch)
                    if out.shape[0] != batch:  # [n, heads, Q, D] -> [B, n * heads, Q, D]
                        # A view where the kernel wrote [n, heads, Q, D] in order (CPU SDPA, flash: its output is
                        # laid out like the query); CUDA's memory-efficient kernel (fp32) writes [n, Q, heads, D]
                        # and hands back its transpose, which no view can merge: then one copy.
                        out = out.reshape(batch, run.num * heads, q_len, head_dim)
                    outs.append((run.first, out))
                finally:
                    if buffer is not None:
                        self.transfer.release(buffer)
        finally:
            if job is not None:
                job.wait()  # workers read the homes and the landed queries: never leave them running
        if job is not None:
            outs.extend(zip(on_host, self._finish_host(job).split(heads, dim=1)))
            outs.sort(key=lambda item: item[0])
        out = torch.cat([o for _, o in outs], dim=1) if len(outs) > 1 else outs[0][1]  # [B, H, Q, D]
        return out.transpose(1, 2)

    def units(self, layer_idx: int, room: int, is_host_step: bool, batch: int = 1) -> list[Run]:
        """What the loop attends in turn, in group order: runs of adjacent groups streamed from the layer's stack
        (as many as one ping-pong buffer holds at ``room`` tokens each; batch 1 only), and single groups (resident,
        on disk); groups attended on the host this step are left out."""
        per_run = min(len(self.layers[layer_idx]), max(1, self.transfer.buffer_rows(layer_idx) // room)) if batch == 1 else 1
        key = (layer_idx, per_run, is_host_step)
        units = self._units.get(key)
        if units is None:
            homes = self.layers[layer_idx]
            units = []
            for g, home in enumerate(homes):
                if is_host_step and (layer_idx, g) in self.host_slots:
                    continue
                last = units[-1] if units else None
                if (last is not None and last.first + last.num == g and last.num < per_run
                        and g in homes.stacked and last.first in homes.stacked):
                    units[-1] = Run(layer_idx, last.first, last.num + 1)
                else:
                    units.append(Run(layer_idx, g, 1))
            self._units[key] = units
        return units

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
                    for part in home.spans(start, stop, plane):
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

    def _prefetch_after(self, run: Run, index: int, past: int, q_len: int, is_host_step: bool, batch: int) -> None:
        following = self._next_fetched(run.layer, index, past, q_len, is_host_step, batch)
        if following is None:
            return  # nothing is fetched on such steps
        run, index, past, q_len, is_next_forward = following
        start = visible_start(past, self.windows[run.layer])
        self.transfer.prefetch(run, self.layers[run.layer], start, past, past - start + q_len)
        if self.disk is not None:
            # One run further: the kernel reads a disk home's pages while the next run's copy and compute run.
            after = self._next_fetched(run.layer, index, past, q_len, is_host_step, batch)
            if after is not None and not (after[4] and is_next_forward):  # (not two forwards ahead)
                run_after, _, past_after, _, _ = after
                home_after = self.layers[run_after.layer][run_after.first]
                if home_after.group.is_on_disk:
                    start_after = visible_start(past_after, self.windows[run_after.layer])
                    for plane in range(len(home_after.planes)):
                        for part in home_after.spans(start_after, past_after, plane):
                            self.disk.read_ahead(part)

    def _next_fetched(self, layer_idx: int, index: int, past: int, q_len: int, is_host_step: bool, batch: int):
        """The fetched run after unit ``index`` of ``layer_idx`` in forward order: (run, its index, past, Q, whether
        it belongs to the next forward). After the forward's last one it wraps around to the *next* forward (decode
        step or chunk): it starts at past + Q, with one query token assumed (its length is not known yet). None
        when such steps fetch nothing."""
        layers = self._fetching[is_host_step]
        candidates = itertools.chain([(layer_idx, index + 1, past, q_len, False)],
                                     ((l, 0, past, q_len, False) for l in layers if l > layer_idx),
                                     ((l, 0, past + q_len, 1, True) for l in layers if l <= layer_idx))
        for layer, first, past_then, q_then, is_next_forward in candidates:
            start = visible_start(past_then, self.windows[layer])
            units = self.units(layer, past_then - start + q_then, is_host_step, batch)
            for i in range(first, len(units)):
                if self.layers[layer][units[i].first].is_host:
                    return units[i], i, past_then, q_then, is_next_forward
        return None
