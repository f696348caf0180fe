"""Exact attention of a step's few queries over head groups whose KV lives in host memory, computed there.

At long context, decode reads every KV byte once per token. For an offloaded head group that means crossing
the PCIe link, slower than the host reading the same bytes from RAM (docs/benchmarks/gpu-h200.md). So during
decode the queries of some offloaded groups (a few KB) go to the host, attention runs over their homes here, and
the output heads (a few KB) go back, while the device streams the other groups. The result is the same softmax,
not an approximation.

One layer's host-attended groups are one job (homes are token-major ``[capacity, B, 2, g, D]``, see ``homes.py``):

- where a C compiler exists, one call of the C kernel (``native.py``): its own thread pool cuts the visible tokens
  ``[start, stop)`` of every group into tiles, reads each once in its stored dtype (bf16/fp16/fp32, 8-bit codes
  with their scales), keeps scores, softmax sums and outputs in fp32, merges the tiles' partials by their
  log-sum-exp weights and writes the output in the queries' dtype. On asynchronous streams (CUDA) the call runs
  on one dispatching thread, after ``ready`` (the copies landed), while the device streams the other groups;
  on synchronous ones (CPU compute) it runs at once on the caller's thread;
- elsewhere the torch tile: the same split-K on ``workers.TorchWorkers`` (one core each), each tile widened into a
  per-thread fp32 buffer, then two matmuls, merged the same way;
- GQA is folded: the ``n_rep`` query heads that share a KV head are rows of one matrix, so K/V are read once;
- sliding windows and causality (for steps of several queries) mask only the tiles they cut; Gemma 2's softcap
  is ``softcap * tanh(scores / softcap)``, exactly as transformers' eager attention computes it;
- 8-bit homes (``quant.py``) are read as codes and dequantized as they are read (``code * scale`` in fp32), never
  as a dequantized copy of the whole context.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from . import native
from .streams import SyncStreams
from ..native.workers import TorchWorkers, shared_workers, usable_cores

#: Most home bytes per tile. Torch tile: small enough that the tile and its fp32 copy stay in one core's L2
#: cache, large enough that its ~8 torch calls cost little next to reading it. The C kernel sizes its own tiles
#: (host_pool.c: at most 2 MiB, smaller where a call would otherwise leave threads idle); a ``tile_bytes`` given
#: to ``HostAttention`` caps them (tests: many tiles, so that the merge merges).
TILE_BYTES = {"torch": 1 << 20, "native": 2 << 20}
_MIN_TILE_BYTES = 64 << 10  # below this a tile's fixed cost dominates, even if some workers stay idle

_SWEEPS_PER_WORKER = 4
_scratch = threading.local()  # per worker thread: the fp32 copy of the tile being computed


@dataclass(frozen=True)
class _Call:
    """What every tile of one job reads, and where it writes its partial."""

    query: torch.Tensor  # [Gh, B, g, R, D] fp32, pre-scaled (by the first task, once the queries landed);
    #                      R = n_rep * Q rows, (repeat, query) order
    kvs: tuple[torch.Tensor, ...]  # Gh homes [capacity, B, 2, g, D] (8-bit homes: their codes)
    scales: tuple[torch.Tensor, ...] | None  # 8-bit homes: Gh scale planes [capacity, B, 2, g, 1]; else None
    start: int  # first visible key position
    past: int  # position of the first query
    q_len: int
    window: int | None
    softcap: float | None
    tile: int  # tokens per tile
    m: torch.Tensor  # [Gh, S, B, g, R, 1] row max of each tile's scores
    l: torch.Tensor  # [Gh, S, B, g, R, 1] sum of exp(scores - m)
    acc: torch.Tensor  # [Gh, S, B, g, R, D] exp(scores - m) @ values


class HostJob:
    """One layer's host attention in flight. The worker finishing the last sweep merges the partials there: its
    torch ops run single-threaded, while on the caller's thread they would wake an OpenMP team per op."""

    def __init__(self, call: _Call, num_sweeps: int, query: torch.Tensor, fold_scale: float, out: torch.Tensor,
                 streams):
        self._call, self._query, self._fold_scale = call, query, fold_scale
        self._out, self._streams = out, streams
        self._error: BaseException | None = None
        self._sweeps_left, self._failed, self._lock = num_sweeps, False, threading.Lock()
        self._is_folded, self._fold_lock = False, threading.Lock()
        self._futures: list[Future] = []
        self._started = time.perf_counter()
        self.seconds: float | None = None  # wall time from start to the merged result

    def wait(self) -> None:
        """Returns once no worker touches this job's inputs any more (also when a tile raised)."""
        for future in self._futures:
            error = future.exception()
            self._streams.joined(future)
            self._error = self._error or error
        self.seconds = time.perf_counter() - self._started

    def result(self) -> torch.Tensor:
        """[B, Gh * g * n_rep, Q, D] on the host, in the query's dtype, after ``wait``; re-raises a tile's exception."""
        if self._error is not None:
            raise self._error
        return self._out

    def _run(self, tasks: list[tuple[int, int]], ready) -> None:
        is_done = False
        try:
            if ready is not None:
                # On CUDA the home's newest tokens and the queries are still being copied on the d2h stream:
                # this thread blocks until they have landed (see Transfer.to_host) before reading either.
                ready()
            self._fold()
            call, streams = self._call, self._streams
            for group, first, last in _tile_spans(call, tasks):
                streams.host_read(call.kvs[group][first:last], "a host-attended home")
                if call.scales is not None:
                    streams.host_read(call.scales[group][first:last], "a host-attended home's scales")
            for group, index in tasks:
                _tile(call, group, index)
            is_done = True
        finally:
            with self._lock:
                self._sweeps_left -= 1
                self._failed |= not is_done
                is_last = self._sweeps_left == 0 and not self._failed
            if is_last:
                self._merge()

    def _fold(self) -> None:
        """[B, Gh*g*n_rep, Q, D] -> [Gh, B, g, n_rep*Q, D] fp32, scaled: the rows sharing a KV head become one
        matrix; the scale (and Gemma 2's 1/softcap) is folded in, one multiply per job instead of per tile.
        The first task does it, after ``ready``: only then have the queries landed in host memory."""
        with self._fold_lock:
            if self._is_folded:
                return
            query, folded = self._query, self._call.query
            self._streams.host_read(query, "the queries sent to the host")
            batch, _, _, head_dim = query.shape
            num_groups, _, g, rows, _ = folded.shape
            folded.copy_(query.reshape(batch, num_groups, g, rows, head_dim).permute(1, 0, 2, 3, 4))
            folded.mul_(self._fold_scale)
            self._is_folded = True

    def _merge(self) -> None:
        call = self._call
        top = call.m.amax(dim=1, keepdim=True)  # [Gh, 1, B, g, R, 1]; finite: every query sees its own key
        weight = torch.exp(call.m - top)  # a tile a row cannot see has m = -inf: weight 0
        merged = (weight * call.acc).sum(dim=1) / (weight * call.l).sum(dim=1)  # [Gh, B, g, R, D]
        self._streams.host_write(self._out, "host attention's output")
        self._out.copy_(merged.permute(1, 0, 2, 3, 4).reshape(self._out.shape))  # heads: (group, kv, rep)


class NativeJob:
    """One layer's host attention through one C call, in flight on the dispatching thread or already done."""

    def __init__(self, run, streams, is_async: bool):
        self._streams, self._error, self._future = streams, None, None
        self._started = time.perf_counter()
        self.seconds: float | None = None  # wall time from start to the merged result
        if is_async:
            self._future = streams.submit(_dispatcher(), run)
        else:
            try:
                run()
            except BaseException as error:  # raised by result(), as from a worker
                self._error = error
            self.seconds = time.perf_counter() - self._started

    def wait(self) -> None:
        """Returns once the call no longer touches this job's inputs (also when it raised)."""
        if self._future is not None:
            self._error = self._future.exception()
            self._streams.joined(self._future)
            self.seconds = time.perf_counter() - self._started

    def result(self) -> torch.Tensor:
        """[B, Gh * g * n_rep, Q, D] on the host, in the query's dtype, after ``wait``; re-raises the call's error."""
        if self._error is not None:
            raise self._error
        return self._out


@functools.cache
def _dispatcher() -> ThreadPoolExecutor:
    """The one thread that makes asynchronous C calls (it blocks in ``ready``, then in the call, GIL released)."""
    return ThreadPoolExecutor(1, thread_name_prefix="headinfer-host-call")


class HostAttention:
    """Runs the kernel: the C kernel on ``num_threads`` threads (default: every usable core), or the torch tile on
    a pool of single-core workers (default: the process's shared pool)."""

    def __init__(self, workers: TorchWorkers | None = None, tile_bytes: int | None = None, use_native: bool = True,
                 streams=None, num_threads: int | None = None):
        self._workers = workers
        self.streams = streams if streams is not None else SyncStreams()
        self.native = native.kernel() if use_native else None
        self.num_threads = num_threads or (workers.num_threads if workers is not None else usable_cores())
        self.tile_bytes = tile_bytes or TILE_BYTES["torch" if self.native is None else "native"]
        self._tile_bytes_given = tile_bytes is not None

    @property
    def workers(self) -> TorchWorkers:
        """The torch tile's pool (started on first use: the C kernel has its own)."""
        if self._workers is None:
            self._workers = shared_workers()
        return self._workers

    def start(self, query: torch.Tensor, kvs: list[torch.Tensor], start: int, stop: int, *, scaling: float,
              window: int | None = None, softcap: float | None = None, ready=None,
              scales: list[torch.Tensor] | None = None, out: torch.Tensor | None = None):
        """Starts attention of ``query`` over tokens ``[start, stop)`` of each home in ``kvs``.

        query: [B, Gh * g * n_rep, Q, D] on the host; its Q tokens are the last Q of ``[start, stop)``, already in
        the homes. ``ready``: called before anything is read, the query included (asynchronous streams: waits for
        the copies; this thread never reads the query). ``scales``: for 8-bit homes (``kvs`` are then their
        codes), their scale planes. ``out``: where the result goes (default: a new tensor). Call ``wait()`` on
        the job, then ``result()``.
        """
        batch, num_heads, q_len, head_dim = query.shape
        num_groups, (_, kv_batch, _, g, kv_dim) = len(kvs), kvs[0].shape
        assert (kv_batch, kv_dim) == (batch, head_dim), (query.shape, kvs[0].shape)
        assert num_heads % (num_groups * g) == 0, (query.shape, kvs[0].shape)
        assert stop - start >= q_len, (start, stop, q_len)
        if out is None:
            out = torch.empty(batch, num_heads, q_len, head_dim, dtype=query.dtype)
        assert out.shape == query.shape and out.dtype == query.dtype and out.is_contiguous(), (out.shape, query.shape)
        if self.native is not None and native.can_attend(query, kvs, scales):
            return self._start_native(query, kvs, start, stop, scaling, window, softcap, ready, scales, out)
        return self._start_torch(query, kvs, start, stop, scaling, window, softcap, ready, scales, out)

    def _start_native(self, query, kvs, start, stop, scaling, window, softcap, ready, scales, out) -> NativeJob:
        streams = self.streams
        checked = getattr(streams, "checker", None) is not None  # declarations cost a slice per home: only
        #                                                           where a happens-before checker reads them
        tile_bytes = self.tile_bytes if self._tile_bytes_given else 0

        def run() -> None:
            if ready is not None:
                # On CUDA the home's newest tokens and the queries are still being copied on the d2h stream:
                # this thread blocks until they have landed (see Transfer.to_host) before reading either.
                ready()
            if checked:
                streams.host_read(query, "the queries sent to the host")
                for group, kv in enumerate(kvs):
                    streams.host_read(kv[start:stop], "a host-attended home")
                    if scales is not None:
                        streams.host_read(scales[group][start:stop], "a host-attended home's scales")
                streams.host_write(out, "host attention's output")
            native.attend_layer(query, kvs, start, stop, out, scaling=scaling, window=window, softcap=softcap,
                                scales=scales, num_threads=self.num_threads, tile_bytes=tile_bytes)

        job = NativeJob(run, streams, is_async=streams.is_async)
        job._out = out
        return job

    def _start_torch(self, query, kvs, start, stop, scaling, window, softcap, ready, scales, out) -> HostJob:
        batch, num_heads, q_len, head_dim = query.shape
        num_groups, (_, _, _, g, _) = len(kvs), kvs[0].shape
        n_rep = num_heads // (num_groups * g)
        rows = n_rep * q_len
        folded = torch.empty(num_groups, batch, g, rows, head_dim, dtype=torch.float32)  # filled by the job once the queries landed
        row_bytes = batch * 2 * g * head_dim * kvs[0].element_size()
        most = max(16, self.tile_bytes // row_bytes)
        fewest = min(most, max(16, _MIN_TILE_BYTES // row_bytes))
        sweeps = _SWEEPS_PER_WORKER * self.workers.num_threads
        tile = min(most, max(fewest, math.ceil((stop - start) * num_groups / sweeps)))  # every worker gets tiles
        num_tiles = math.ceil((stop - start) / tile)
        m = torch.empty(num_groups, num_tiles, batch, g, rows, 1)
        call = _Call(folded, tuple(kvs), tuple(scales) if scales else None, start, stop - q_len, q_len,
                     window, softcap, tile, m,
                     torch.empty_like(m), torch.empty(num_groups, num_tiles, batch, g, rows, head_dim))
        tasks = [(h, s) for h in range(num_groups) for s in range(num_tiles)]
        # Contiguous sweeps of tiles (each walks memory forward), a few per worker: few futures, and a worker
        # that the OS pauses delays only a small share of the job.
        per_sweep = math.ceil(len(tasks) / sweeps)
        sweeps = [tasks[i : i + per_sweep] for i in range(0, len(tasks), per_sweep)]
        job = HostJob(call, len(sweeps), query, scaling / softcap if softcap else scaling, out, self.streams)
        job._futures = [self.streams.submit(self.workers, job._run, sweep, ready) for sweep in sweeps]
        return job

    def attend(self, query: torch.Tensor, kvs: list[torch.Tensor], start: int, stop: int, **kwargs) -> torch.Tensor:
        """``start(...)``, waited: [B, Gh * g * n_rep, Q, D]."""
        job = self.start(query, kvs, start, stop, **kwargs)
        job.wait()
        return job.result()


def _tile_spans(call: _Call, tasks: list[tuple[int, int]]):
    """(group, first, last) token ranges a sweep of tiles reads, one per contiguous stretch of a group."""
    spans: list[list[int]] = []
    for group, index in tasks:
        first = call.start + index * call.tile
        last = min(first + call.tile, call.past + call.q_len)
        if spans and spans[-1][0] == group and spans[-1][2] == first:
            spans[-1][2] = last
        else:
            spans.append([group, first, last])
    return spans


def _tile(call: _Call, group: int, index: int) -> None:
    """One tile's partial (m, l, acc) of one head group, written into its slot of the job's buffers."""
    first = call.start + index * call.tile
    last = min(first + call.tile, call.past + call.q_len)
    block = call.kvs[group][first:last]  # [T, B, 2, g, D] in the home's dtype, contiguous
    if block.dtype != torch.float32 or call.scales is not None:
        block = _fp32_copy(block)
    if call.scales is not None:  # 8-bit codes: dequantized here, a tile at a time
        block.mul_(call.scales[group][first:last])
    keys = block.select(2, 0).permute(1, 2, 3, 0)  # [B, g, D, T]
    values = block.select(2, 1).permute(1, 2, 0, 3)  # [B, g, T, D]
    scores = torch.matmul(call.query[group], keys)  # [B, g, R, T]
    if call.softcap:
        scores.tanh_().mul_(call.softcap)
    m, hidden = call.m[group, index], _hidden(call, first, last)
    if hidden is None:
        torch.amax(scores, dim=-1, keepdim=True, out=m)
        scores.sub_(m)
    else:
        scores.masked_fill_(hidden, float("-inf"))
        torch.amax(scores, dim=-1, keepdim=True, out=m)
        scores.sub_(m.nan_to_num(neginf=0.0))  # a row that sees no key of this tile: exp(-inf) = 0, not NaN
    scores.exp_()
    torch.sum(scores, dim=-1, keepdim=True, out=call.l[group, index])
    torch.matmul(scores, values, out=call.acc[group, index])


def _hidden(call: _Call, first: int, last: int) -> torch.Tensor | None:
    """[R, T] True where a query row must not see a key of tile [first, last); None if it sees them all.

    Query i (position past + i) sees key j iff j <= past + i and, with window W, j > past + i - W.
    """
    newest_seen_by_all = call.past  # the first query's own key: later ones are hidden from it (causality)
    newest_hidden_from_last = -1 if call.window is None else call.past + call.q_len - 1 - call.window
    if last - 1 <= newest_seen_by_all and first > newest_hidden_from_last:
        return None
    q_pos = torch.arange(call.past, call.past + call.q_len)[:, None]
    k_pos = torch.arange(first, last)[None, :]
    hidden = k_pos > q_pos
    if call.window is not None:
        hidden |= k_pos <= q_pos - call.window
    rows = call.query.shape[3] // call.q_len
    return hidden.repeat(rows, 1)  # rows are (repeat, query) pairs


def _fp32_copy(block: torch.Tensor) -> torch.Tensor:
    """``block`` widened into this thread's reused fp32 buffer (no allocation, so no page faults, per tile)."""
    buffer = getattr(_scratch, "buffer", None)
    if buffer is None or buffer.numel() < block.numel():
        buffer = _scratch.buffer = torch.empty(block.numel(), dtype=torch.float32)
    out = buffer[: block.numel()].view(block.shape)
    out.copy_(block)
    return out
