"""The CUDA path on a CPU: runs of the engine on emulated streams (with the happens-before checker) vs stock.

One case = a cache configuration (head group, resident slots, host attention, 8-bit KV, disk tier) driven
through a chunked prefill (optionally interrupted between layers and resumed, as a cancelled read is) and
greedy decode steps, compared logit by logit with stock transformers on the same weights. Used by the parity
grid (``test_streams_grid.py``) and by the mutation test (``test_stream_mutations.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import tempfile
from dataclasses import dataclass

import torch
from transformers import DynamicCache

import engine
from engine.interrupt import interruptible
from engine.errors import ForwardInterrupted
from engine.kv import disk_stream
from engine.planning.shape import ModelShape, stored_kv_bytes
from engine.kv.pin_budget import ENV_LIMIT

# Chunks of 20 (> HOST_QUERY_LIMIT) attend on the device and fetch; the last chunk (5) and decode steps are
# host steps where host attention is on.
PROMPT_LEN, CHUNK, DECODE_STEPS, MAX_CONTEXT = 45, 20, 6, 64


@dataclass(frozen=True)
class Case:
    name: str
    group: str = "1"  # "1" or "all" (layer-wise)
    resident: str = "0"  # "0" or "partial"
    host: str = "off"  # "off", "all", or "split" (half the offloaded bytes on the host)
    kv_dtype: str | None = None
    disk: bool = False
    cancel: bool = False  # interrupt the second chunk between layers, crop and resume
    grow: bool = False  # a chunk longer than planned, a context past max_context: buffers and homes grow
    overlap: bool = True
    follow_ups: tuple[int, ...] = ()  # steps of several tokens after the decode steps (as follow-up questions)
    context: int = MAX_CONTEXT  # the planned context (``max_context``); homes and buffers are sized for it
    disk_share: float = 0.75  # with ``disk``: about this share of the KV bytes goes to the disk tier
    per_buffer: int | None = None  # groups per ping-pong buffer (None: the plan's, a layer's run without a budget)
    pin_share: float | None = None  # a pin limit (HEADINFER_PIN_LIMIT) of this share of the KV bytes: the homes
    # past it are pageable and fetched through the staging ring (``engine/kv/staging_ring.py``)


CASES = [
    Case("stream"),
    # Buffers of one group each (the paper's plan): near the planned context every group is fetched alone.
    Case("stream-single", per_buffer=1),
    Case("host-all", host="all", cancel=True),
    Case("host-split", host="split"),
    Case("layerwise-partial", group="all", resident="partial", cancel=True),
    Case("int8-host", kv_dtype="int8", host="all"),
    Case("fp8-stream", kv_dtype="fp8"),
    Case("disk-stream", disk=True, cancel=True),
    Case("disk-host", disk=True, host="all"),
    Case("disk-split-no-overlap", disk=True, host="split", overlap=False),
    Case("disk-split", disk=True, host="split", follow_ups=(3, 20)),
    # Host steps of several tokens (the last longer than any before: host buffers grow), then a device chunk;
    # and host steps that wrap the window rings past a prefetch made before them.
    # (Buffers of one group: the follow-ups outgrow them, so they grow with fetches in flight.)
    Case("grow-host", host="all", grow=True, follow_ups=(3, 8, 8, 17), per_buffer=1),
    Case("ring-host-steps", host="all", follow_ups=(5, 5, 5, 5)),  # (no longer than the last chunk: no growth)
    # A device chunk's prefetch of the next forward's first slot, a disk home, is never used by the host steps
    # after it; the next device step finds it stale (another range), refetches it, and the buffer it held is
    # taken over for a RAM home. (An odd number of offloaded slots makes that the other buffer; more context,
    # so the follow-ups still prefetch.)
    Case("disk-dropped-prefetch", group="all", disk=True, host="all", disk_share=0.15, context=128,
         follow_ups=(20, 3, 20)),
    # A plan four times the context with buffers of one group: at this short context a buffer still holds several,
    # so a layer's adjacent streamed groups are fetched (one batched copy) and attended as one run, in decode steps
    # too; exact and 8-bit homes. (With the plan's buffers, "stream" runs whole layers at any context.)
    Case("stream-runs", context=256, per_buffer=1),
    Case("fp8-runs", kv_dtype="fp8", context=256, per_buffer=1),
    # Pinned memory as a budget: a pin limit of 1/20 of the KV (no home pinned, every fetch through the staging
    # ring's few buffers, reused many times a fetch); and of half (some homes pinned, the rest staged), with runs
    # of stacked groups and host attention reading pageable homes.
    Case("pin-limit", pin_share=0.05),
    Case("pin-half-runs", pin_share=0.5, host="split", context=256, per_buffer=1),
]


@dataclass
class Outcome:
    max_rel_diff: float  # over every prefill and decode logit vs stock
    same_tokens: bool  # greedy tokens identical
    races: list[str]
    num_checked: int  # accesses the checker saw
    logits: list[torch.Tensor]  # the prefill's, then each decode step's (to compare lossy 8-bit runs)
    staged_fetches: int = 0  # fetches of pageable homes through the staging ring
    pinned_peak: int = 0  # the most the streams' pin budget held at once


def _rel(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).abs().max() / expected.abs().max())


def _stop_at_second_layer_once():
    calls = {"n": 0}

    def should_stop() -> bool:
        calls["n"] += 1
        return calls["n"] == 2  # checked before each decoder layer: stop before the second one, once

    return should_stop


def make_cache(model, case: Case, *, streams: str = "emulated", disk_dir: str | None = None):
    shape = ModelShape.from_config(model.config.get_text_config(decoder=True))
    layerwise = math.gcd(*shape.kv_heads)  # (layers that differ in KV heads: the largest group dividing them all)
    policy = dict(head_group_size=1 if case.group == "1" else layerwise, chunk_size=CHUNK,
                  resident_slots=0 if case.resident == "0" else 1, kv_dtype=case.kv_dtype,
                  host_attention="all" if case.host in ("all", "split") else "off", streams=streams,
                  max_context=48 if case.grow else case.context, overlap=case.overlap, device="cpu",
                  groups_per_buffer=case.per_buffer)
    if case.disk:
        # (Buffers of one group: the least the plan needs besides the homes. Bigger buffers would be the first to
        # give way to a host budget, before any home went to disk.)
        probe = engine.HeadInferCache(model.config, **{**policy, "streams": "sync", "groups_per_buffer": 1})
        policy.update(disk_dir=disk_dir, host_memory=probe.plan.host_bytes - int(kv_bytes(model, case) * case.disk_share))
    cache = engine.HeadInferCache(model.config, **policy)
    assert not case.disk or cache.plan.disk_slots > 0, cache.plan
    if case.host == "split":
        cache.plan = dataclasses.replace(cache.plan, host_share=0.5)  # read when the homes are allocated
    return cache


def kv_bytes(model, case: Case) -> int:
    """fp32 K and V of every home at the case's planned context."""
    shape = engine.HeadInferCache(model.config, streams="sync", device="cpu", max_context=case.context).shape
    return stored_kv_bytes(dataclasses.replace(shape, dtype_bytes=4), case.context, CHUNK, None)


@torch.inference_mode()
def run(stock, headinfer, case: Case, *, streams: str = "emulated") -> Outcome:
    """Runs ``case`` on ``headinfer`` (its cache on ``streams``) and stock side by side. A race the checker finds
    on this thread raises ``RaceError``; one found on a worker thread is in ``Outcome.races``."""
    # Disk fetches move through pieces of two rows: each fetch reuses the few pinned pieces many times.
    pieces = contextlib.nullcontext() if not case.disk else _patched(disk_stream, "PIECE_BYTES", 256)
    limit = None if case.pin_share is None else str(max(1, int(kv_bytes(headinfer, case) * case.pin_share)))
    with tempfile.TemporaryDirectory() as folder, pieces, _environment(ENV_LIMIT, limit):
        cache = make_cache(headinfer, case, streams=streams, disk_dir=folder)
        try:
            return _run(stock, headinfer, case, cache)
        finally:
            cache.release()  # (the checker sees the homes freed: no copy may still touch them)


def _run(stock, headinfer, case: Case, cache) -> Outcome:
    vocab = stock.config.get_text_config(decoder=True).vocab_size
    ids = torch.randint(0, vocab, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(7))
    stock_cache = DynamicCache(config=stock.config)
    expected = stock(ids, past_key_values=stock_cache).logits
    checker = None
    logits = []
    # Grow: the second chunk is longer than planned (the staging buffers grow with the first one's appends in
    # flight); decode passes max_context (homes grow); the last follow-up fetches more than the ping-pong
    # buffers hold (they grow) while the homes still have room.
    starts = [0, CHUNK] if case.grow else list(range(0, PROMPT_LEN, CHUNK))
    for start, stop in zip(starts, [*starts[1:], PROMPT_LEN]):
        chunk = ids[:, start:stop]
        if case.cancel and start == CHUNK:
            try:
                with interruptible(headinfer, _stop_at_second_layer_once()):
                    headinfer(chunk, past_key_values=cache)
                raise AssertionError("the forward was not interrupted")
            except ForwardInterrupted:
                # Layers that took the chunk give it back, as DocumentSession does; a hybrid model's fixed-size
                # states cannot go back, so it reads again from the last point they can return to.
                kept = cache.restorable_length(start, states_advanced=True)
                cache.crop_to(kept)
                if kept < start:
                    assert kept == 0, kept
                    logits = [headinfer(ids[:, :start], past_key_values=cache).logits]
        logits.append(headinfer(chunk, past_key_values=cache).logits)
        checker = checker or getattr(cache.transfer.streams, "checker", None)
    logits = [torch.cat(logits, dim=1)]
    diffs = [_rel(logits[0], expected)]
    same = True
    expected_last, actual_last = expected[:, -1], logits[-1][:, -1]
    for _ in range(DECODE_STEPS):
        token = expected_last.argmax(-1, keepdim=True)
        same &= bool(torch.equal(token, actual_last.argmax(-1, keepdim=True)))
        expected_last = stock(token, past_key_values=stock_cache).logits[:, -1]
        actual_last = headinfer(token, past_key_values=cache).logits[:, -1]
        logits.append(actual_last)
        diffs.append(_rel(actual_last, expected_last))
    same &= bool(torch.equal(expected_last.argmax(-1), actual_last.argmax(-1)))
    for num, seed in zip(case.follow_ups, range(100, 200)):
        step = torch.randint(0, vocab, (1, num), generator=torch.Generator().manual_seed(seed))
        expected_step = stock(step, past_key_values=stock_cache).logits
        actual_step = headinfer(step, past_key_values=cache).logits
        logits.append(actual_step)
        diffs.append(_rel(actual_step, expected_step))
        same &= bool(torch.equal(expected_step.argmax(-1), actual_step.argmax(-1)))
    cache.synchronize()
    races = list(checker.races) if checker is not None else []
    ring, budget = cache.transfer.ring, cache.transfer.streams.pin_budget
    return Outcome(max(diffs), same, races, checker.num_checked if checker is not None else 0, logits,
                   ring.num_fetches if ring is not None else 0, budget.peak if budget is not None else 0)


@contextlib.contextmanager
def _environment(name: str, value: str | None):
    """``os.environ[name] = value`` inside (None: left as it is)."""
    saved = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if value is not None:
            if saved is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = saved


@contextlib.contextmanager
def _patched(owner, name: str, value):
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


def max_rel_diff(a: Outcome, b: Outcome) -> float:
    return max(_rel(x, y) for x, y in zip(a.logits, b.logits))
