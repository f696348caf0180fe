"""Offload policy: the user-facing knobs of the head-wise engine, validated once."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import InputError

HOST_ATTENTION_MODES = ("auto", "off", "all")
STREAMS = ("auto", "cuda", "sync", "emulated", "cuda-lagged")  # engine/kv/streams.py


@dataclass(frozen=True)
class OffloadPolicy:
    """How the KV cache is split between the compute device and host memory.

    Every ``None`` means "let the planner decide" (see ``engine.planning.planner``).

    Attributes:
        chunk_size: tokens per prefill chunk; bounds activation memory.
        head_group_size: KV heads fetched to the device together; divides num_kv_heads.
            ``num_kv_heads`` is layer-wise offload; ``None`` is adaptive.
        resident_slots: number of (layer, head group) slots whose KV stays on the
            compute device, using spare memory instead of crossing the link.
            ``None``: as many as the budget allows (all of them on a CPU-only machine).
        groups_per_buffer: head groups' worth of visible context each of the two ping-pong buffers holds, so that
            a run of that many adjacent streamed groups is fetched with one copy and attended in one call.
            ``None``: as many as the budget allows, at most a layer's longest run of streamed groups
            (``engine.planning.planner``); 1 is the paper's one group per buffer.
        pin_memory: page-locked host storage (needed for async copies on CUDA).
            ``None``: on when CUDA is the compute device.
        overlap: fetch the next head group on a side stream while the current one
            computes. ``False`` runs the same loop with synchronous copies.
        max_context: tokens to pre-allocate in the host store; ``None`` grows on demand.
        gpu_memory: device memory budget in bytes; ``None`` reads the device (``engine.planning.budgets``).
        gpu_reserve: bytes of the device's free memory left to the display, the browser and other programs when
            the budget is read (default 1.5 GiB); ignored with ``gpu_memory``.
        host_memory: host memory budget in bytes for the KV store; ``None`` reads the system.
        kv_dtype: ``None`` (exact: K/V in the model's dtype), or ``"int8"`` / ``"fp8"``: host-memory KV stored
            in 8 bits with a scale per token and head — half the RAM and link bytes of bf16, and LOSSY
            (answers may differ from the model's own). Off by default.
        disk_dir: a folder for the disk tier: when the offloaded KV exceeds ``host_memory``, the rest of the
            slots live in files there (exact, slower). ``None``: no disk tier.
        disk_memory: bytes the disk tier may use; ``None``: the folder's free space.
        exceed_trained_window: let the context grow past the model's trained window (answers degrade,
            often to nonsense, beyond it); off, the planner caps the context at that window.
        host_attention: where decode steps (few query tokens) attend offloaded head groups.
            ``"auto"``: on CUDA, the planner splits them between streaming over the link and computing
            attention on the host, where their KV lives, so that both halves finish together (from the
            machine's measured rates); on CPU compute nothing crosses a link, so it is off.
            ``"all"``: every offloaded group on the host. ``"off"``: every offloaded group streamed.
            Prefill always attends on the compute device.
        streams: the streams backend every KV copy and event goes through (``engine/kv/streams.py``).
            ``"auto"``: the environment variable ``HEADINFER_STREAMS`` if set, else CUDA streams on a GPU and
            synchronous ones on a CPU. ``"emulated"``: CPU only, side streams as delayed worker threads with the
            happens-before checker (proves the CUDA ordering without a GPU; slower). ``"cuda-lagged"``: CUDA
            with injected lag (the self-check).
    """

    chunk_size: int = 4096
    head_group_size: int | None = None
    resident_slots: int | None = None
    groups_per_buffer: int | None = None
    pin_memory: bool | None = None
    overlap: bool = True
    max_context: int | None = None
    gpu_memory: int | None = None
    gpu_reserve: int = 3 << 29  # 1.5 GiB
    host_memory: int | None = None
    kv_dtype: str | None = None
    disk_dir: str | None = None
    disk_memory: int | None = None
    exceed_trained_window: bool = False
    host_attention: str = "auto"
    streams: str = "auto"

    def __post_init__(self) -> None:
        _check_positive("chunk_size", self.chunk_size)
        if self.head_group_size is not None:
            _check_positive("head_group_size", self.head_group_size)
        if self.resident_slots is not None and (not _is_int(self.resident_slots) or self.resident_slots < 0):
            raise InputError(f"resident_slots must be an integer >= 0 or None, got {self.resident_slots!r}")
        if self.groups_per_buffer is not None:
            _check_positive("groups_per_buffer", self.groups_per_buffer)
        if self.max_context is not None:
            _check_positive("max_context", self.max_context)
        for name in ("gpu_memory", "host_memory", "disk_memory"):
            value = getattr(self, name)
            if value is not None:
                _check_positive(name, value)
        if not _is_int(self.gpu_reserve) or self.gpu_reserve < 0:
            raise InputError(f"gpu_reserve must be an integer >= 0, got {self.gpu_reserve!r}")
        if self.kv_dtype not in (None, "int8", "fp8"):
            raise InputError(f"kv_dtype must be None, 'int8' or 'fp8', got {self.kv_dtype!r}")
        if self.pin_memory not in (None, True, False):
            raise InputError(f"pin_memory must be True, False or None, got {self.pin_memory!r}")
        if self.exceed_trained_window not in (True, False):
            raise InputError(f"exceed_trained_window must be True or False, got {self.exceed_trained_window!r}")
        if self.overlap not in (True, False):
            raise InputError(f"overlap must be True or False, got {self.overlap!r}")
        if self.streams not in STREAMS:
            raise InputError(f"streams must be one of {', '.join(map(repr, STREAMS))}, got {self.streams!r}")
        if self.host_attention not in HOST_ATTENTION_MODES:
            raise InputError(f"host_attention must be one of {', '.join(map(repr, HOST_ATTENTION_MODES))}, "
                             f"got {self.host_attention!r}")

    def validate_for(self, num_kv_heads: int | tuple[int, ...], *, option: str | None = None) -> None:
        """Checks the knobs that depend on the model shape; ``num_kv_heads``: the model's KV heads per layer, or
        each layer's where they differ (a head group must divide every layer's); ``option`` names the head group
        as the caller's user set it (``"--head-group"``). The one place this check lives."""
        group = self.head_group_size
        if group is None:
            return
        counts = sorted(set(num_kv_heads)) if isinstance(num_kv_heads, tuple) else [num_kv_heads]
        name = f"{option} {group}" if option else f"head_group_size={group}"
        common = math.gcd(*counts)
        divisors = ", ".join(str(d) for d in range(1, common + 1) if common % d == 0)
        heads = (f"{counts[0]} KV heads per layer" if len(counts) == 1
                 else f"layers of {' and '.join(map(str, counts))} KV heads")
        if group > min(counts):
            raise InputError(f"{name}: this model has {heads}, and {group} exceeds the model's {min(counts)} KV "
                             f"heads; use one of {divisors} (or leave it to the planner)")
        if any(count % group for count in counts):
            # Equal groups keep every ping-pong buffer and staging buffer one shape (one copy, one kernel each).
            raise InputError(f"{name}: this model has {heads} and a head group must divide them; use one of "
                             f"{divisors} (or leave it to the planner)")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_positive(name: str, value: object) -> None:
    if not _is_int(value) or value < 1:
        raise InputError(f"{name} must be a positive integer, got {value!r}")
