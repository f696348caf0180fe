"""Host <-> device movement of KV: the named streams, the staging and ping-pong buffers, and their events.

Three streams take part: the compute stream (whatever is current), ``h2d`` (fetching a head group's past
into a free ping-pong buffer) and ``d2h`` (appending a chunk's new K/V to host homes). Every buffer and every
event is allocated once; an event is re-recorded, never created, on the hot path. Streams, events and copies
come from the streams seam (``streams.py``): CUDA, synchronous (a CPU-only machine: every call completes at
once) or emulated (worker threads + the happens-before checker), so this is one code path on all three.

Two staging and two ping-pong buffers (``buffers.py``) serve every layer, and (CUDA) one attention scratch.
Disk-tier homes move through the disk stream's worker and pinned pieces instead (``disk_stream.py``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from concurrent.futures import Future

import torch

from . import quant
from .buffers import Appends, BufferFactory, PingPong, Run, Scratch, Slot, Staging, copy_parts  # noqa: F401 (Slot)
from .disk_stream import DiskStream
from .homes import GroupHome, LayerHomes
from .ledger import HOST_IO, Ledger
from .staging_ring import StagingRing
from .streams import SyncStreams

logger = logging.getLogger(__name__)




class Transfer:
    """Owns the streams, the staging and ping-pong buffers and every event of one cache."""

    def __init__(self, device: torch.device, *, num_layers: int, num_groups: int, group_shape: tuple[int, int, int],
                 dtype: torch.dtype, buffer_tokens: int, stage_tokens: int, kv_dtype: str | None = None,
                 disk=None, streams=None, ledger: Ledger | None = None, scratch_elements: int = 0,
                 layer_shapes: tuple[tuple[int, int], ...] = ()):
        """``group_shape``: (B, g, D) of one head group, ``num_groups`` a layer's groups; where layers differ in KV
        shape, ``layer_shapes`` gives each one's (groups, D) and the other two are the largest (the buffers' size:
        ``buffer_tokens`` and ``stage_tokens`` count rows at that size)."""
        self.device = device
        self.ledger = ledger if ledger is not None else Ledger()  # every buffer's bytes (``ledger.py``)
        self.streams = streams if streams is not None else SyncStreams()
        new_event = self.streams.event
        self.h2d = self.streams.new_stream("h2d")
        self.d2h = self.streams.new_stream("d2h")
        self._batch, self._group_size, self._head_dim = group_shape
        self._num_groups, self.kv_dtype = num_groups, kv_dtype
        # each layer's (groups, head_dim): its staged chunks' and fetched groups' shape
        self._layer_shapes = tuple(layer_shapes) or ((num_groups, group_shape[2]),) * num_layers
        self._alloc = BufferFactory(device, group_shape, num_groups, dtype, kv_dtype, self.ledger,
                                    layers=tuple(layer_shapes))
        largest = (self._batch, 2, self._group_size, self._head_dim)
        self._pingpong = [PingPong(self._alloc.pingpong(buffer_tokens), new_event(), new_event(),
                                    codes=self._alloc.codes(buffer_tokens), row=largest) for _ in range(2)]
        self._staging = [Staging(self._alloc.staging(stage_tokens), new_event(), new_event(),
                                  codes=self._alloc.staging_codes(stage_tokens)) for _ in range(2)]
        self._staged_codes: dict[int, tuple] = {}
        # Pageable homes (past a pin limit) are fetched through pinned ring buffers on a worker (``staging_ring.py``),
        # made now: pinned before any home is. None without a limit.
        row_bytes = self._batch * 2 * self._group_size * self._head_dim * quant.element_size(dtype)
        self.ring = StagingRing.for_streams(self.streams, row_bytes, buffer_tokens, self.ledger)
        # Where the fused attention routes copy a block's K/V (``Scratch``); None where attention copies nothing.
        self.scratch = Scratch(self._alloc.scratch, scratch_elements) if scratch_elements else None
        self._next_staging = 0
        # Host threads wait for append events (host attention reads the homes): blocking, so they sleep.
        self._appends = [Appends((new_event(blocking=True), new_event(blocking=True))) for _ in range(num_layers)]
        self._host_query: torch.Tensor | None = None  # page-locked landing place of queries sent to the host
        self._query_source: torch.Tensor | None = None  # the device queries the last such copy reads
        self._query_ready, self._query_landed = new_event(), new_event(blocking=True)
        # Host attention's outputs come back through one page-locked buffer. A layer's host threads write it only
        # after its queries landed, and those were sent after the compute stream issued the copy out of the last
        # layer's output: no event of its own is needed (the mutation test showed one could never matter).
        self._host_out: torch.Tensor | None = None
        # Disk-tier homes (``disk``: their DiskMemory) move on the disk stream's worker thread.
        self.disk = DiskStream(self.streams, num_groups, disk, self.ledger) if disk is not None else None
        self._disk_writes: dict[int, Future] = {}  # layer -> its newest append to a disk home (CUDA)
        self.num_fetches = 0  # every fetch into a ping-pong buffer ...
        self.num_on_demand = 0  # ... and those the compute stream had to wait for, not prefetched

    # -- staging and appends -----------------------------------------------------------------------
    def stage(self, key: torch.Tensor, value: torch.Tensor, layer: int | None = None) -> tuple[int, torch.Tensor]:
        """Writes a layer's chunk in home layout. key/value: [B, KVH, Q, D]. Returns (index, [G, Q, B, 2, g, D])."""
        batch, num_kv_heads, q_len, head_dim = key.shape
        g = self._group_size
        num_groups = num_kv_heads // g
        expected = self._layer_shapes[layer] if layer is not None else (num_groups, head_dim)
        assert (batch, num_kv_heads, head_dim) == (self._batch, g * expected[0], expected[1]), tuple(key.shape)
        index = self._next_staging
        self._next_staging ^= 1
        staging = self._staging[index]
        streams = self.streams
        if staging.flat.numel() < q_len * batch * 2 * num_kv_heads * head_dim:
            self.synchronize()  # rare (a forward longer than the planned chunk): a safe point to swap buffers
            logger.info("growing staging buffer %d to %d tokens", index, q_len)
            streams.forget(staging.flat)
            staging.flat, staging.free_recorded = self._alloc.staging(q_len), False
            staging.codes = self._alloc.staging_codes(q_len)
            staging.views = {}
        if staging.free_recorded:
            # The appends of two layers ago may still be reading this buffer on the d2h stream.
            streams.current().wait_event(staging.free)
        out, stacked, codes = staging.chunk_views(num_groups, q_len, (batch, 2, g, head_dim))
        streams.write(out, "the staging buffer")
        # [B, KVH, Q, D] -> [G, Q, B, 2, g, D]: K and V stacked into ``out`` seen as [2, B, G, g, Q, D]
        torch.stack([key.view(batch, num_groups, g, q_len, head_dim),
                     value.view(batch, num_groups, g, q_len, head_dim)], dim=0, out=stacked)
        if self.kv_dtype is not None:  # 8-bit host homes receive the chunk quantized (half the d2h bytes)
            streams.write(codes[0], "the staged codes")
            streams.write(codes[1], "the staged scales")
            quant.quantize(out, self.kv_dtype, out=(codes[0], codes[1]))
            self._staged_codes[index] = (codes[0], codes[1])
        staging.produced.record(streams.current())
        return index, out

    def append(self, layer_idx: int, homes: LayerHomes, staged: torch.Tensor, index: int, position: int) -> None:
        """Copies the staged chunk ([G, Q, B, 2, g, D]) into every home of the layer at ``position`` (host homes on
        the d2h stream: the stacked ones in RAM with one batched copy, ``LayerHomes.stack``)."""
        coded = self._staged_codes.get(index)
        sources = coded if coded is not None else (staged,)  # per plane of a host home: [G, Q, ...]
        host = []  # (home, one block per plane): homes outside the stack (the disk tier's)
        copy = self.streams.copy
        blocks = None
        for group_idx, home in enumerate(homes):
            if not home.is_host:  # a resident home: a device copy, ordered on the compute stream
                home.write(position, staged[group_idx], copy)
            elif group_idx not in homes.stacked:
                blocks = blocks if blocks is not None else [s.unbind(0) for s in sources]
                host.append((home, [b[group_idx] for b in blocks]))
        if not host and not homes.stacked:
            return
        disk = self.disk
        staging, appends = self._staging[index], self._appends[layer_idx]
        event = appends.events[appends.next_event]
        appends.next_event ^= 1
        with self.streams.use(self.d2h):
            # The copies must not start before the compute stream has written the staging buffer.
            self.d2h.wait_event(staging.produced)
            for buffer in self._pingpong:
                # A window ring's append overwrites its oldest rows: a prefetch of this layer still in flight
                # (made for a step that did not come, e.g. a decode step attended on the host) may be reading them.
                if (buffer.pending is not None and buffer.pending[0] == layer_idx
                        and _ring_overlap(homes[0], position, staged.shape[1], buffer.start, buffer.stop)):
                    self.d2h.wait_event(buffer.ready)
            try:
                if homes.stacked:
                    self._append_stacked(homes, sources, position, staged.shape[1])
                for home, parts in host:
                    if disk is not None and home.group.is_on_disk:  # through pinned memory, into the file later
                        written = disk.append(home, position, parts)
                        if written is not None:
                            self._disk_writes[layer_idx] = written
                    else:
                        home.write_planes(position, parts, copy)
            finally:  # whatever was enqueued still reads the staging buffer: its reuse must wait for it
                staging.free.record(self.d2h)
                event.record(self.d2h)
        staging.free_recorded = True
        appends.entries = [*appends.entries[-1:], (position, event)]

    def _append_stacked(self, homes: LayerHomes, sources: tuple[torch.Tensor, ...], position: int, q_len: int) -> None:
        """The chunk's rows of every stacked home, all planes, as one batched copy (on the current stream)."""
        targets, blocks = [], []
        for plane, source in enumerate(sources):
            picked = source.unbind(0)
            picked = [picked[g] for g in homes.stacked]  # [Q, B, 2, g, D] each
            done = 0
            for part in homes.stacked_rows(position, position + q_len, plane):  # [num stacked, n, ...]
                num = part.shape[1]
                targets.extend(part.unbind(0))
                blocks.extend(picked if num == q_len else [p.narrow(0, done, num) for p in picked])
                done += num
        self.streams.copy_many(targets, blocks, "a KV home")

    def _landing(self, layer_idx: int, stop: int):
        """The append event a fetch of tokens [.., stop) of this layer must wait for, if any.

        Appends are FIFO on the d2h stream, so waiting for the newest append that writes below ``stop`` covers
        every older one. The current chunk's own append (at ``position >= stop``) is not waited for: that is
        what lets the h2d and d2h engines run at once. Older appends than the two kept are covered by the
        oldest kept one.
        """
        entries = self._appends[layer_idx].entries
        for position, event in reversed(entries):
            if position < stop:
                return event
        return entries[0][1] if entries else None

    # -- host attention: a step's queries to host memory, and its outputs back ------------------------------
    def to_host(self, layer_idx: int, query: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None]]:
        """Sends a step's queries ([B, H, Q, D], a few KB) to host memory, behind the layer's appends.

        Returns (host tensor, wait): a host thread calls ``wait()`` before it reads the host tensor or the
        homes: it returns once the queries and this layer's appended chunk are in host memory. The returned
        tensor is valid until the next call (one landing buffer serves every layer; a layer waits for its host
        job before the next starts).
        """
        streams = self.streams
        # The d2h copy reads ``query`` after this returns: held until the next call, by which time it has landed
        # (the caching allocator must not hand its memory to the compute stream while the copy may still read it).
        self._query_source = query
        self._ensure_host_buffers(query.numel(), query.dtype)
        target = self._host_query[: query.numel()].view(query.shape)
        # The queries are written on the compute stream: the copy on d2h must not start before.
        streams.write(query, "the queries (written by attention's projection)")
        self._query_ready.record(streams.current())
        with streams.use(self.d2h):
            self.d2h.wait_event(self._query_ready)
            streams.copy(target, query, "the queries sent to the host")
            self._query_landed.record(self.d2h)
        # For disk homes, this step's chunk is written into the files by the worker (in order: the newest covers all)
        written = self._disk_writes.get(layer_idx)
        landed = self._query_landed

        def wait() -> None:
            # Host threads read the home up to this step's tokens: the d2h append of this chunk must have landed.
            # It was issued before the query copy on the same FIFO stream, so waiting for the queries covers it
            # (the mutation test showed a separate wait for the append's event could never matter).
            landed.synchronize()
            if written is None:
                return
            # (Several host threads call this at once: exception() only waits for the write, raising nothing.)
            error = written.exception()
            streams.joined(written)
            if error is not None:
                self.disk.acknowledge()  # reported here, through the host job
                raise error

        return target, wait

    def _ensure_host_buffers(self, numel: int, dtype: torch.dtype) -> None:
        """Page-locked landing (queries) and output buffers for host steps of ``numel`` query elements."""
        if self._host_query is not None and self._host_query.numel() >= numel and self._host_query.dtype == dtype:
            return
        if self._host_query is not None:
            # (Rare: a longer step than any before.) The last copies into the landing buffer and out of the
            # output buffer must have run before they are dropped.
            self.synchronize()
            self.streams.forget(self._host_query)
            self.streams.forget(self._host_out)
            # Dropped before the new ones are made: the old and new never held together (a Gemma 4 global layer's
            # longer head_dim comes after a sliding layer's first step; the ledger holds the plan's two buffers).
            self._host_query = self._host_out = None
        self._host_query = self._pinned(numel, dtype)
        self._host_out = self._pinned(numel, dtype)  # (the output has the queries' shape)

    def _pinned(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        self.ledger.check(HOST_IO, numel * quant.element_size(dtype), "cpu")
        return self.ledger.record(HOST_IO, self.streams.pinned((numel,), dtype))

    def host_result(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The page-locked buffer a host job writes its output into (after its ``to_host`` wait, see above);
        ``shape``/``dtype``: those of the queries just sent."""
        return self._host_out[: math.prod(shape)].view(shape)

    def from_host(self, out: torch.Tensor) -> torch.Tensor:
        """Copies a host job's output (from ``host_result``, complete) to the device, without blocking."""
        device_out = torch.empty(out.shape, dtype=out.dtype, device=self.device)
        self.streams.copy(device_out, out, "host attention's output")
        return device_out

    # -- ping-pong fetches ---------------------------------------------------------------------------
    def buffer_rows(self, layer: int) -> int:
        """Token rows of one group of ``layer`` in the smaller ping-pong buffer: a run of n groups of ``room`` tokens
        fits if n * room <= it."""
        row = self._row(layer)
        return min(b.rows(row) for b in self._pingpong)

    def _row(self, layer: int) -> tuple[int, int, int, int]:
        """(B, 2, g, D) of one token of one group of ``layer``."""
        return self._batch, 2, self._group_size, self._layer_shapes[layer][1]

    def prefetch(self, run: Run, homes: LayerHomes, start: int, stop: int, room: int) -> None:
        """Starts copying tokens [start, stop) of the run's homes into a free ping-pong buffer with ``room`` tokens
        per group."""
        same_run = next((b for b in self._pingpong if b.pending == run), None)
        if same_run is not None and (same_run.start, same_run.stop) == (start, stop):
            return
        # A stale fetch of this run (another range) is replaced in its own buffer, never duplicated.
        buffer = same_run or next((b for b in self._pingpong if not b.is_used and b.pending is None), None)
        if buffer is None:
            return  # both busy: the run is fetched on demand when acquired
        if buffer.rows(self._row(run.layer)) < room * run.num:
            return  # past the plan (a next step that may never come): grown on demand only if it does
        self._fetch(buffer, run, homes, start, stop, room)

    def acquire(self, run: Run, homes: LayerHomes, start: int, stop: int, room: int) -> int:
        """Returns the index of the buffer holding tokens [start, stop) of the run's homes, fetching now if not
        prefetched."""
        index = next((i for i, b in enumerate(self._pingpong) if b.pending == run), None)
        if index is not None:
            buffer = self._pingpong[index]
            if (buffer.start, buffer.stop) != (start, stop) or buffer.rows(self._row(run.layer)) < room * run.num:
                logger.debug("prefetched %s held %s, needed %s: refetching", run, (buffer.start, buffer.stop),
                             (start, stop))
                buffer.pending = None
                index = None
        if index is None:
            index = next((i for i, b in enumerate(self._pingpong) if not b.is_used and b.pending is None), None)
            if index is None:  # the free one holds a prefetch for another run: drop it
                index = next(i for i, b in enumerate(self._pingpong) if not b.is_used)
            self._fetch(self._pingpong[index], run, homes, start, stop, room)
            self.num_on_demand += 1
        buffer = self._pingpong[index]
        self._join(buffer)  # a disk home's fetch has enqueued its copies (and recorded ``ready``) once joined
        streams = self.streams
        # Attention must not read the buffer before its copy has landed.
        streams.current().wait_event(buffer.ready)
        if buffer.is_coded:  # 8-bit codes landed: dequantize into the buffer attention reads
            kv, codes = self._targets(buffer, buffer.stop - buffer.start)
            streams.read(codes[0], "fetched codes")
            streams.read(codes[1], "fetched scales")
            streams.write(kv, "the dequantized ping-pong buffer")
            quant.dequantize(codes[0], codes[1], out=kv)
            buffer.is_coded = False
        buffer.pending, buffer.is_used = None, True
        return index

    def with_chunk(self, index: int, num_past: int, chunk: torch.Tensor) -> torch.Tensor:
        """Puts this chunk after ``num_past`` fetched tokens of each group of the buffer's run.

        chunk: [Q, B, 2, g, D] (a run of one group), or [n, Q, 1, 2, g, D] (a run of n groups, batch 1).
        Returns [num_past + Q, B, 2, g, D], or [num_past + Q, n, 2, g, D]: the run's groups as the batch."""
        buffer = self._pingpong[index]
        if buffer.num == 1:
            kv = buffer.kv
            self.streams.copy(kv[num_past : num_past + chunk.shape[0]], chunk, "this chunk after the fetched past")
            out = kv[: num_past + chunk.shape[0]]
        else:
            kv, _, attended = buffer.run_views(buffer.num)  # [n, rows, 1, 2, g, D], [rows, n, 2, g, D]
            q_len = chunk.shape[1]
            # (one copy for the run: its groups' rows are strided in the buffer, a device copy takes them so)
            self.streams.copy(kv.narrow(1, num_past, q_len), chunk, "this chunk after the fetched past")
            out = attended.narrow(0, 0, num_past + q_len)
        self.streams.read(out, "the ping-pong buffer attention reads")
        return out

    def release(self, index: int) -> None:
        """Marks the end of the compute stream's use of a buffer."""
        buffer = self._pingpong[index]
        buffer.is_used = False
        buffer.free.record(self.streams.current())
        buffer.free_recorded = True

    def release_all(self) -> None:
        """Releases buffers an interrupted layer left acquired (a no-op after a normal layer)."""
        for index, buffer in enumerate(self._pingpong):
            if buffer.is_used:
                logger.debug("releasing ping-pong buffer %d left in use by an interrupted forward", index)
                self.release(index)

    def _fetch(self, buffer: PingPong, run: Run, homes: LayerHomes, start: int, stop: int, room: int) -> None:
        self._join(buffer)  # a dropped disk fetch into this buffer must not land after this one
        streams = self.streams
        home = homes[run.first]
        row = self._row(run.layer)
        if buffer.rows(row) < room * run.num:
            self.synchronize()  # rare (context beyond the plan): a safe point to drop the old buffer
            # (in rows at the largest head_dim, what the factory counts: a smaller layer's rows need fewer)
            needed = -(-room * run.num * math.prod(row) // self._alloc.row_elements)
            held = buffer.flat.numel() // self._alloc.row_elements
            capacity = max(needed, held + held // 2)
            logger.info("growing ping-pong buffers to %d tokens", capacity)
            for old in [buffer.flat, *(buffer.codes or [])]:
                streams.forget(old)
            buffer.flat, buffer.free_recorded = self._alloc.pingpong(capacity), False
            buffer.codes = self._alloc.codes(capacity)
            buffer.views = {}
        buffer.pending, buffer.start, buffer.stop, buffer.num, buffer.row = run, start, stop, run.num, row
        buffer.is_coded = home.is_quantized
        self.num_fetches += 1
        kv, codes = self._targets(buffer, stop - start) if run.num == 1 else buffer.run_views(run.num)[:2]
        targets = codes if home.is_quantized else [kv]  # (a run's: [n, rows, ...] views, filled up to stop - start)
        on_disk = self.disk is not None and home.group.is_on_disk
        assert run.num == 1 or not on_disk, "disk homes are fetched one group at a time"
        with streams.use(self.h2d):
            if buffer.free_recorded:
                # The compute stream may still be reading this buffer's previous group.
                self.h2d.wait_event(buffer.free)
            if on_disk:
                # Read on the worker while this thread attends the group before. It enqueues the copies on h2d
                # behind the wait above, after the appends it was given earlier (it runs jobs in order): no
                # append event to wait for.
                buffer.disk_job = self.disk.fetch(home, start, stop, targets, self.h2d, buffer.ready)
                return
            landing = self._landing(run.layer, stop)
            if self.ring is not None and self.ring.stages(home.kv):  # pageable: memcpy'd on the ring's worker
                buffer.disk_job = self.ring.fetch(*self._fetch_pairs(run, homes, start, stop, targets), self.h2d,
                                                  landing, buffer.ready)
                return
            if landing is not None:
                # Earlier chunks of this layer may still be landing in the host home on the d2h stream.
                self.h2d.wait_event(landing)
            if run.num == 1:
                for plane, target in enumerate(targets):
                    copy_parts(streams.copy, target, home.spans(start, stop, plane), "a fetch into a ping-pong buffer")
            else:
                self._fetch_stacked(run, homes, start, stop, targets)
            buffer.ready.record(self.h2d)

    def _fetch_pairs(self, run: Run, homes: LayerHomes, start: int, stop: int, targets: list[torch.Tensor]):
        """(targets, sources) of a fetch, piece by piece: what ``_fetch`` copies, for the staging ring."""
        dsts, srcs = [], []
        if run.num > 1:
            self._fetch_stacked(run, homes, start, stop, targets, lambda d, s, what: (dsts.extend(d), srcs.extend(s)))
            return dsts, srcs
        for plane, target in enumerate(targets):
            copy_parts(lambda d, s, what: (dsts.append(d), srcs.append(s)), target,
                       homes[run.first].spans(start, stop, plane))
        return dsts, srcs

    def _fetch_stacked(self, run: Run, homes: LayerHomes, start: int, stop: int, targets: list[torch.Tensor],
                       copy_many=None) -> None:
        """A run of stacked homes into its buffer views ([n, tokens, ...] per plane): one batched copy, one piece
        per group and contiguous part (on the current stream; ``copy_many``: instead of the streams')."""
        first = homes.stacked.index(run.first)
        pieces, sources = [], []
        for plane, target in enumerate(targets):
            done = 0
            for part in homes.stacked_rows(start, stop, plane):  # [num stacked, n, ...]
                num = part.shape[1]
                sources.extend(part.unbind(0)[first : first + run.num])
                pieces.extend(target.narrow(1, done, num).unbind(0))
                done += num
        (copy_many or self.streams.copy_many)(pieces, sources, "a fetch into a ping-pong buffer")

    @staticmethod
    def _targets(buffer: PingPong, num: int) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Where the buffer's run keeps ``num`` tokens per group: (kv, [codes, scales] or None); a run of one group:
        [num, B, 2, g, D], of n groups: [n, num, B, 2, g, D] (strided views)."""
        if buffer.num == 1:
            kv, codes = buffer.shaped(buffer.row)
            return kv[:num], [c[:num] for c in codes] if codes else None
        kv, codes, _ = buffer.run_views(buffer.num)
        return kv.narrow(1, 0, num), [c.narrow(1, 0, num) for c in codes] if codes else None

    def _join(self, buffer: PingPong) -> None:
        """Waits for the buffer's disk fetch, if any; its failure is raised here (and so reported)."""
        if buffer.disk_job is None:
            return
        job, buffer.disk_job = buffer.disk_job, None
        try:
            job.result()
            self.streams.joined(job)
        except BaseException:
            buffer.pending = None  # half filled: never to be acquired as this slot's fetch
            if self.disk is not None:
                self.disk.acknowledge()
            raise

    # -- bookkeeping -----------------------------------------------------------------------------------
    def forget(self) -> None:
        """Drops prefetches and appends bookkeeping, e.g. after a crop; call after ``synchronize``."""
        for buffer in self._pingpong:
            buffer.pending, buffer.disk_job = None, None  # (synchronize drained the disk jobs)
        for appends in self._appends:
            appends.entries = []
        self._disk_writes.clear()

    def fence(self) -> None:
        """Returns once no copy into or out of host memory is in flight."""
        try:
            if self.ring is not None:
                self.ring.drain()  # first, as the disk's: its jobs enqueue copies on h2d and wait on d2h
            if self.disk is not None:
                self.disk.drain()
        finally:  # (even after a failed disk job, nothing may be in flight when this returns)
            self.h2d.synchronize()
            self.d2h.synchronize()

    def close(self) -> None:
        """Stops the disk stream's worker (after its jobs) and the streams; the transfer is not used afterwards.
        Call after ``synchronize``: the buffers are freed."""
        try:
            if self.ring is not None:
                self.ring.close()
            if self.disk is not None:
                self.disk.close()
        finally:
            holders = [*self._pingpong, *self._staging]
            for tensor in [self._host_query, self._host_out, *(b.flat for b in self._pingpong),
                           *(s.flat for s in self._staging), *(c for h in holders for c in (h.codes or []))]:
                if tensor is not None:
                    self.streams.forget(tensor)
            self.streams.close()

    def synchronize(self) -> None:
        """Waits for every copy and every kernel in flight (and every disk job)."""
        try:
            self.fence()
        finally:
            self.streams.current().synchronize()

    @property
    def is_idle(self) -> bool:
        return not any(b.is_used for b in self._pingpong)

    @property
    def buffer_bytes(self) -> int:
        coded = [c for holder in [*self._pingpong, *self._staging] for c in (holder.codes or [])]
        scratch = self.scratch.flat.nbytes if self.scratch is not None else 0
        return (sum(b.flat.nbytes for b in self._pingpong) + sum(s.flat.nbytes for s in self._staging)
                + sum(c.nbytes for c in coded) + scratch)


def _ring_overlap(home: GroupHome, position: int, num: int, start: int, stop: int) -> bool:
    """Whether appending tokens [position, position + num) to a ring overwrites a row of tokens [start, stop).

    Token t lives in row t % capacity: rows collide where p - t is a positive multiple of the capacity.
    (A home that is not a ring never overwrites: a fetch reads tokens below the append.)"""
    if not home.is_ring or stop <= start:
        return False
    capacity = home.capacity
    low, high = position - stop + 1, position + num - 1 - start  # the range of p - t
    first = max(capacity, -(-low // capacity) * capacity)
    return first <= high
