"""What the KV core will allocate for a plan, category by category: the promise the ledger (``kv/ledger.py``)
holds the engine to.

The categories are the ledger's. ``slot_placement`` is also what the cache uses to place its homes, so the plan
and the allocation cannot disagree on which slots are resident, in RAM or on disk.
"""

from __future__ import annotations

from engine.kv import kernels
from engine.kv.schedule import HOST_QUERY_LIMIT
from engine.planning.shape import ModelShape, disk_stream_bytes

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


def home_capacity(window: int | None, capacity: int, chunk: int) -> int:
    """Tokens a layer's homes hold: every token, or a window ring of its window plus one chunk."""
    return capacity if window is None else min(capacity, window - 1 + chunk)


def scratch_elements(shape: ModelShape, *, capacity: int, chunk: int, group: int, cuda: bool, batch: int = 1,
                     dtype_bytes: int | None = None) -> int:
    """Elements of a cache's attention scratch (``buffers.Scratch``): the contiguous K and V that SDPA's fused
    kernels read, ``[2, B, g * expand, visible, D]``; 0 where attention runs on strided views (the CPU).

    ``visible`` is what a ping-pong buffer holds (a group's past plus one chunk, a window ring's at most): every
    attended block fits, a run of ``n`` groups having ``visible / n`` tokens each. fp32 GQA expands K/V to the
    query heads (``expand = n_rep``: the memory-efficient kernel, the only fused one for fp32, has no GQA)."""
    if not kernels.copies_kv("cuda" if cuda else "cpu"):
        return 0
    dtype_bytes = shape.dtype_bytes if dtype_bytes is None else dtype_bytes
    expand = shape.num_heads // shape.num_kv_heads if dtype_bytes == 4 else 1
    visible = max(home_capacity(w, capacity, chunk) for w in shape.sliding_windows)
    return 2 * batch * group * expand * max(visible, 1) * shape.head_dim


def planned_allocations(shape: ModelShape, *, capacity: int, chunk: int, group: int, resident_slots: int,
                        disk_slots: int, cuda: bool, kv_dtype: str | None, host_attention: bool,
                        sources: bool = True, batch: int = 1) -> dict[str, int]:
    """Bytes the KV core allocates by category for homes of ``capacity`` tokens (``policy.max_context``)."""
    num_groups = shape.num_kv_heads // group
    num_slots = shape.num_layers * num_groups
    resident, on_disk = slot_placement(num_slots, resident_slots, disk_slots, cuda=cuda,
                                       quantized=kv_dtype is not None)
    row = batch * 2 * group  # K and V of one head group, one token: rows of head_dim channels
    exact, coded = row * shape.head_dim * shape.dtype_bytes, row * (shape.head_dim + _SCALE_BYTES)
    homes = 0
    for slot in range(num_slots):
        tokens = home_capacity(shape.sliding_windows[slot // num_groups], capacity, chunk)
        homes += max(tokens, 1) * (coded if kv_dtype is not None and slot not in resident else exact)
    any_offloaded = len(resident) < num_slots
    # A fetch holds a group's visible past plus one chunk: a sliding layer never needs more than its window.
    visible = max(home_capacity(w, capacity, chunk) for w in shape.sliding_windows) if any_offloaded else 1
    plan = dict.fromkeys(CATEGORIES, 0)
    plan[HOMES] = homes
    plan[PINGPONG] = 2 * max(visible, 1) * exact
    plan[STAGING] = 2 * max(chunk, 1) * num_groups * exact
    if kv_dtype is not None:  # code planes beside both ping-pong buffers and both staging buffers
        plan[CODES] = 2 * (max(visible, 1) + max(chunk * num_groups, 1)) * coded
    if host_attention and any_offloaded:
        plan[HOST_IO] = 2 * batch * shape.num_heads * HOST_QUERY_LIMIT * shape.head_dim * shape.dtype_bytes
    if cuda and on_disk:
        plan[DISK_STREAM] = disk_stream_bytes(shape, chunk, kv_dtype)
    plan[SCRATCH] = scratch_elements(shape, capacity=capacity, chunk=chunk, group=group, cuda=cuda,
                                     batch=batch) * shape.dtype_bytes
    if sources and any(w is None for w in shape.sliding_windows):
        # One layer's retrieval heads at a time: their keys [H, L, D] stacked, and the mass [H, L] in float64.
        plan[SOURCES] = SOURCE_HEADS * capacity * (shape.head_dim * shape.dtype_bytes + 8)
    return plan


def allocations_total(allocations: dict[str, int]) -> int:
    return sum(allocations.values())

