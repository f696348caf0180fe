"""``Plan``: one context length's resolved placement of weights and KV cache, and ``PlanError``.

``engine.planning.planner.make_plan`` builds plans; this module only holds what a plan says and how it reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import PlanError

GIB = 1 << 30
MAX_CONTEXT = 2**31  # the largest context any plan considers

LIMIT_MEMORY, LIMIT_MAX_CONTEXT, LIMIT_MODEL = "memory", "max_context", "model"


@dataclass(frozen=True)
class Plan:
    """A resolved placement of weights and KV cache, and whether it fits the budgets."""

    context_tokens: int
    chunk_size: int
    head_group_size: int
    num_groups: int
    resident_slots: int
    total_slots: int
    device_is_cuda: bool
    gpu_breakdown: dict
    gpu_bytes: int
    host_bytes: int
    gpu_budget: int | None
    host_budget: int | None
    fits: bool  # the memory budgets hold ``context_tokens``
    reason: str  # why not, when they do not
    max_context_tokens: int  # the most that fits in memory
    context_limit: int = MAX_CONTEXT  # min(memory, policy.max_context, the model's trained window)
    limited_by: str = LIMIT_MEMORY  # which of the three binds: LIMIT_MEMORY, LIMIT_MAX_CONTEXT or LIMIT_MODEL
    disk_bytes: int = 0  # the disk tier's share of the offloaded KV (policy.disk_dir)
    disk_slots: int = 0  # offloaded slots whose homes are files
    # Head groups' worth of visible context each of the two ping-pong buffers holds: a run of that many adjacent
    # streamed groups of a layer is fetched with one copy and attended in one call (``engine.kv.schedule``).
    groups_per_buffer: int = 1
    # Decode (``engine.planning.host_split``): the share of offloaded KV bytes the host attends, and the predicted
    # seconds per token of KV movement, and of host round trips where there is a split, at ``context_tokens``
    # (None without measured rates).
    host_attention: str = "off"
    host_share: float = 0.0
    decode_seconds: float | None = None
    pcie_floor_seconds: float | None = None
    host_attention_gbps: float | None = None
    h2d_gbps: float | None = None
    # What the KV core allocates at ``context_tokens`` (homes of that capacity), by the allocation ledger's
    # categories (``engine.planning.allocations``, ``engine.kv.ledger``): bytes, every device together.
    allocations: dict = field(default_factory=dict)
    # Pinned memory as a budget (``engine.planning.pinning``): what this machine lets the engine page-lock (None: no
    # limit found), what the plan pins (the RAM homes within it and the staging ring's buffers), the RAM homes past it
    # (pageable, fetched through the staging ring) and the extra seconds per decode token predicted for them.
    pin_limit: int | None = None
    pinned_bytes: int = 0
    staged_bytes: int = 0
    staging_seconds: float | None = None

    @property
    def allocations_total(self) -> int:
        return sum(self.allocations.values())

    @property
    def is_within_limit(self) -> bool:
        """``context_tokens`` fits the memory budgets and is within the context limit."""
        return self.fits and self.context_tokens <= self.context_limit

    @property
    def limit_reason(self) -> str:
        """What binds the context limit, in words (for refusals and the plan panel)."""
        if self.limited_by == LIMIT_MODEL:
            return (f"this model reads at most {self.context_limit:,} tokens (its trained context window); "
                    "longer texts need a long-context model")
        if self.limited_by == LIMIT_MAX_CONTEXT:
            return f"the context limit (--max-context) is {self.context_limit:,} tokens"
        if not self.fits:
            return self.reason
        return f"at most {self.context_limit:,} tokens fit in memory"

    def require_fit(self) -> None:
        """Raises :class:`PlanError` explaining what does not fit."""
        if not self.fits:
            raise PlanError(self.reason)

    def summary(self) -> str:
        """A few human-readable lines with GiB figures."""
        parts = ", ".join(f"{k} {v / GIB:.2f}" for k, v in self.gpu_breakdown.items())
        lines = [
            f"context {self.context_tokens} tokens, chunk {self.chunk_size}, head group {self.head_group_size} "
            f"({self.num_groups} groups/layer), resident slots {self.resident_slots}/{self.total_slots}, "
            f"{self.groups_per_buffer} group(s) per fetch buffer",
            f"device: {'CUDA' if self.device_is_cuda else 'none (CPU compute)'}; "
            f"GPU {self.gpu_bytes / GIB:.2f} GiB of {_gib(self.gpu_budget)} ({parts})",
            f"host {self.host_bytes / GIB:.2f} GiB of {_gib(self.host_budget)}",
            f"max context with this configuration: {self.max_context_tokens} tokens",
            self.decode_line(),
            self.pinning_line(),
            "fits" if self.fits else f"does not fit: {self.reason}",
        ]
        return "\n".join(lines)

    def pinning_line(self) -> str:
        """How much is pinned and what the staging costs (the plan panel's and the header's words)."""
        if not self.device_is_cuda:
            return "pinned: none (CPU compute)"
        line = f"pinned {self.pinned_bytes / GIB:.2f} GiB"
        if self.pin_limit is not None:
            line += f" of a {self.pin_limit / GIB:.2f} GiB pin limit"
        if self.staged_bytes:
            line += f"; {self.staged_bytes / GIB:.2f} GiB of KV in ordinary memory, through the staging ring"
            if self.staging_seconds is not None:
                line += f" (+{self.staging_seconds * 1e3:.1f} ms/token predicted)"
        return line

    def decode_line(self) -> str:
        """The decode split and, with measured rates, its predicted seconds per token (logged as a cache is built)."""
        line = f"decode: {self.host_share:.0%} of offloaded KV attended on the host ({self.host_attention})"
        if self.decode_seconds is not None:
            line += f", predicted {self.decode_seconds:.3f} s/token of KV movement"
            line += " and host round trips" if self.host_share > 0 and self.device_is_cuda else ""
        if self.pcie_floor_seconds:
            line += f" (PCIe floor {self.pcie_floor_seconds:.3f} s/token at {self.h2d_gbps:.1f} GB/s"
            line += f", host {self.host_attention_gbps:.1f} GB/s)" if self.host_attention_gbps else ")"
        return line


def _gib(n: int | None) -> str:
    return "unlimited" if n is None else f"{n / GIB:.2f} GiB"
