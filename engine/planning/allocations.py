"""What the KV core will allocate for a plan, category by category: the promise the ledger (``kv/ledger.py``)
holds the engine to.

The categories are the ledger's. ``slot_placement`` is also what the cache uses to place its homes, so the plan
and the allocation cannot disagree on which slots are resident, in RAM or on disk.
"""

from __future__ import annotations

from ..kv import kernels
from ..kv.schedule import HOST_QUERY_LIMIT
from .shape import ModelShape, disk_stream_bytes

HOMES, STAGING, PINGPONG, CODES, HOST_IO, DISK_STREAM, SOURCES, SCRATCH = (
    "homes", "staging", "pingpong", "codes", "host_io", "disk_stream", "sources", "scratch")
CATEGORIES = (HOMES, STAGING, PINGPONG, CODES, HOST_IO, DISK_STREAM, SOURCES, SCRATCH)

SOURCE_HEADS = 8  # retrieval heads the sources pass reads (``retrieval_heads.find_retrieval_heads``' default)
_SCALE_BYTES = 4  # one fp32 scale per (token, K or V, head) of an 8-bit plane


def spread(count: int, total: int) -> set[int]:
    """``count`` slot indices spread evenly over ``total``, so resident slots interleave with transfers."""
    return {i * total // count for i in range(count)} if count else set()


def slot_placement(num_slots: int, resident_slots: int, disk_slots: int, *, cuda: bool,
                   quantized: bool) -> tuple[set[int], set[int]]:
    """(resident slot indices, disk slot indices) of a cache: slot ``layer * groups + group``."""
    resident = spread(min(resident_slots, num_slots), num_slots)
    if quantized and not cuda:
        resident = set()  # on a CPU-only machine every home is in RAM: 8-bit applies to all of them
    # The disk tier: spread among the homes in RAM (offloaded ones; on a CPU-only machine any), so that reading
    # one from disk always has RAM slots' compute to hide behind.
    in_ram = [i for i in range(num_slots) if i not in resident or not cuda]
    on_disk = {in_ram[k] for k in spread(min(disk_slots, len(in_ram)), len(in_ram))}
    return resident - on_disk, on_disk


def layer_offsets(groups_per_layer: tuple[int, ...]) -> list[int]:
    """The first slot of each layer: slot ``offsets[layer] + group`` (every layer's groups in turn)."""
    offsets, total = [], 0
    for groups in groups_per_layer:
        offsets.append(total)
        total += groups
    return offsets


def streamed_runs(groups_per_layer: tuple[int, ...], resident: set[int], on_disk: set[int]) -> list[int]:
    """The lengths of every layer's runs of adjacent head groups whose homes are stacked in RAM (streamed: neither
    resident nor on disk): what ``Schedule.units`` may fetch with one copy each."""
    runs = []
    for first, groups in zip(layer_offsets(groups_per_layer), groups_per_layer):
        previous = False  # (runs never cross a layer)
        for slot in range(first, first + groups):
            streamed = slot not in resident and slot not in on_disk
            if streamed and previous:
                runs[-1] += 1
            elif streamed:
                runs.append(1)
            previous = streamed
    return runs


def longest_streamed_run(groups_per_layer: tuple[int, ...], resident: set[int], on_disk: set[int]) -> int:
    """The longest run a ping-pong buffer could ever be asked to hold (0: nothing is streamed)."""
    return max(streamed_runs(groups_per_layer, resident, on_disk), default=0)


def home_capacity(window: int | None, capacity: int, chunk: int) -> int:
    """Tokens a layer's homes hold: every token, or a window ring of its window plus one chunk."""
    return capacity if window is None else min(capacity, window - 1 + chunk)


def scratch_elements(shape: ModelShape, *, capacity: int, chunk: int, group: int, cuda: bool, batch: int = 1,
                     dtype_bytes: int | None = None, groups_per_buffer: int = 1) -> int:
    """Elements of a cache's attention scratch (``buffers.Scratch``): the contiguous K and V that SDPA's fused
    kernels read, ``[2, B, g * expand, visible, D]``; 0 where attention runs on strided views (the CPU).

    ``visible`` is what a ping-pong buffer holds (a group's past plus one chunk, a window ring's at most): every
    attended block fits, a run of ``n`` groups having ``groups_per_buffer * visible / n`` tokens each (batch 1; larger
    batches fetch one group at a time, as the ping-pong buffers do). fp32 GQA expands K/V to the
    query heads (``expand = n_rep``: the memory-efficient kernel, the only fused one for fp32, has no GQA).
    Layers that differ in shape: the largest head_dim and expansion (a ping-pong buffer holds that many elements)."""
    if not kernels.copies_kv("cuda" if cuda else "cpu"):
        return 0
    dtype_bytes = shape.dtype_bytes if dtype_bytes is None else dtype_bytes
    expand = shape.num_heads // shape.min_kv_heads if dtype_bytes == 4 else 1
    visible = max(home_capacity(w, capacity, chunk) for w in shape.sliding_windows)
    return 2 * batch * group * groups_per_buffer * expand * max(visible, 1) * shape.head_dim


def planned_allocations(shape: ModelShape, *, capacity: int, chunk: int, group: int, resident_slots: int,
                        disk_slots: int, cuda: bool, kv_dtype: str | None, host_attention: bool,
                        sources: bool = True, batch: int = 1, groups_per_buffer: int = 1) -> dict[str, int]:
    """Bytes the KV core allocates by category for homes of ``capacity`` tokens (``policy.max_context``), with
    ping-pong buffers of ``groups_per_buffer`` groups' visible context each (batch 1: a run's groups share one
    buffer; larger batches fetch one group at a time, so their buffers hold one)."""
    groups_per_layer = shape.groups_per_layer(group)
    num_slots = sum(groups_per_layer)
    resident, on_disk = slot_placement(num_slots, resident_slots, disk_slots, cuda=cuda,
                                       quantized=kv_dtype is not None)
    row = batch * 2 * group  # K and V of one head group, one token: rows of head_dim channels
    # (buffers: the largest head_dim, which sizes them; homes: each layer's own)
    exact = row * shape.head_dim * shape.dtype_bytes
    homes = 0
    for layer, (first, groups) in enumerate(zip(layer_offsets(groups_per_layer), groups_per_layer)):
        tokens = max(home_capacity(shape.sliding_windows[layer], capacity, chunk), 1)
        dim = shape.head_dims[layer]
        for slot in range(first, first + groups):
            homes += tokens * row * (dim + _SCALE_BYTES if kv_dtype is not None and slot not in resident
                                     else dim * shape.dtype_bytes)
    any_offloaded = len(resident) < num_slots
    # A fetch holds a group's visible past plus one chunk: a sliding layer never needs more than its window.
    visible = max(home_capacity(w, capacity, chunk) for w in shape.sliding_windows) if any_offloaded else 1
    plan = dict.fromkeys(CATEGORIES, 0)
    plan[HOMES] = homes
    rows = max(visible, 1) * (groups_per_buffer if batch == 1 and any_offloaded else 1)  # of one ping-pong buffer
    plan[PINGPONG] = 2 * rows * exact
    # a chunk of the layer with the most K/V elements a token, in home layout
    plan[STAGING] = 2 * max(chunk, 1) * batch * 2 * max(shape.layer_kv_elements) * shape.dtype_bytes
    if kv_dtype is not None:  # code planes beside both ping-pong buffers and both staging buffers
        # (a buffer's scales are one per group row of the smallest head_dim: its view holds the most rows)
        scale_rows = rows * shape.head_dim // min(shape.head_dims)
        staged = max(chunk, 1) * batch * 2 * max(shape.layer_kv_elements)
        plan[CODES] = 2 * (rows * row * shape.head_dim + staged
                           + (scale_rows + max(chunk, 1) * max(groups_per_layer)) * row * _SCALE_BYTES)
    if host_attention and any_offloaded:
        plan[HOST_IO] = 2 * batch * shape.num_heads * HOST_QUERY_LIMIT * shape.head_dim * shape.dtype_bytes
    if cuda and on_disk:
        plan[DISK_STREAM] = disk_stream_bytes(shape, chunk, kv_dtype)
    plan[SCRATCH] = scratch_elements(shape, capacity=capacity, chunk=chunk, group=group, cuda=cuda, batch=batch,
                                     groups_per_buffer=groups_per_buffer if batch == 1 else 1) * shape.dtype_bytes
    if sources and any(w is None for w in shape.sliding_windows):
        # One layer's retrieval heads at a time: their keys [H, L, D] stacked, and the mass [H, L] in float64.
        plan[SOURCES] = SOURCE_HEADS * capacity * (shape.head_dim * shape.dtype_bytes + 8)
    return plan


def allocations_total(allocations: dict[str, int]) -> int:
    return sum(allocations.values())

