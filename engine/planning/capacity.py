"""How far a machine reaches with each capacity option: RAM alone, RAM + 8-bit KV, RAM + a disk tier.

For each option, the largest context the planner admits and the predicted decode seconds per token of KV
movement at that context: offloaded RAM bytes over the host-to-device link, and disk-tier bytes over the
disk's read rate as well (both read every token). Shown on the plan panel; ``benchmarks/disk/capacity.py`` records it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .host_split import DEFAULT_H2D_GBPS
from .planner import make_plan
from ..planning.shape import ModelShape
from .policy import OffloadPolicy


@dataclass(frozen=True)
class CapacityOption:
    name: str
    max_context: int
    host_bytes: int
    disk_bytes: int
    decode_seconds: float | None  # per token, KV movement only; None where a rate is unknown


def capacity_options(shape: ModelShape, policy: OffloadPolicy, *, device_is_cuda: bool, gpu_budget: int | None,
                     host_budget: int | None, disk_dir: str | None = None, link_gbps: float = DEFAULT_H2D_GBPS,
                     disk_gbps: float | None = None) -> list[CapacityOption]:
    """The options this machine has; the disk tier only with a folder (``disk_dir`` or the policy's)."""
    options = {"RAM": dataclasses.replace(policy, kv_dtype=None, disk_dir=None),
               "RAM + 8-bit (lossy)": dataclasses.replace(policy, kv_dtype="int8", disk_dir=None)}
    folder = disk_dir or policy.disk_dir
    if folder is not None:
        options["RAM + disk"] = dataclasses.replace(policy, kv_dtype=None, disk_dir=folder)
    found = []
    for name, option in options.items():
        option = dataclasses.replace(option, max_context=None)
        probe = make_plan(shape, option, 1 << 20, device_is_cuda=device_is_cuda, gpu_budget=gpu_budget,
                          host_budget=host_budget)
        context = max(probe.max_context_tokens, 1)
        plan = make_plan(shape, option, context, device_is_cuda=device_is_cuda, gpu_budget=gpu_budget,
                         host_budget=host_budget)
        seconds = None
        if device_is_cuda and (plan.disk_bytes == 0 or disk_gbps):
            seconds = plan.host_bytes / (link_gbps * 1e9) + (plan.disk_bytes / (disk_gbps * 1e9) if plan.disk_bytes else 0)
        found.append(CapacityOption(name, plan.max_context_tokens, plan.host_bytes, plan.disk_bytes, seconds))
    return found
