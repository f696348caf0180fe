"""What a plan pins and what the rest costs: the pin budget (``engine.kv.pin_budget``) applied to a plan.

Of the offloaded KV homes in RAM, those within the pin limit are page-locked; the rest stay in ordinary memory and
every fetch of them goes through the staging ring (``engine.kv.staging_ring``): a memcpy into a pinned ring buffer that
the h2d copy of the piece before overlaps. A decode step then costs what the slower of the two takes for those
bytes: ``staging_seconds`` is the predicted extra time per token over copying them from pinned memory.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time

import torch

from ..kv.ledger import HOMES
from ..kv.pin_budget import RESERVE_FRACTION, limit_from_env, settle_limit
from ..kv.staging_ring import MAX_BUFFER_BYTES, NUM_BUFFERS, RING_SHARE
from .plan import Plan

logger = logging.getLogger(__name__)


def with_pinning(plan: Plan, machine=None, *, memcpy_gbps: float | None = None) -> Plan:
    """``plan`` with ``pin_limit``, ``pinned_bytes``, ``staged_bytes`` and ``staging_seconds`` filled in. The limit:
    a measured machine's (settled once per process: ``HEADINFER_PIN_LIMIT``, or probed where pins are capped), else
    the variable's; a CPU plan pins nothing."""
    if not plan.device_is_cuda:
        return plan
    if machine is not None and getattr(machine, "device_is_cuda", False):
        limit = settle_limit(machine.host_budget or 0)
    else:
        limit = limit_from_env()
    ram_slots = plan.total_slots - plan.resident_slots - plan.disk_slots
    in_ram = plan.allocations.get(HOMES, 0) * ram_slots // max(1, plan.total_slots - plan.disk_slots)
    if limit is None:
        return dataclasses.replace(plan, pinned_bytes=in_ram)
    ring = min(NUM_BUFFERS * MAX_BUFFER_BYTES, int(limit * RING_SHARE))
    pinned = min(in_ram, max(0, int((limit - ring) * (1 - RESERVE_FRACTION))))
    staged = in_ram - pinned
    seconds = None
    if staged and plan.h2d_gbps:
        gbps = memcpy_gbps if memcpy_gbps is not None else measure_memcpy_gbps()
        # Each decode step fetches the streamed share of every staged home once; the ring's memcpy and the h2d
        # copy overlap, so the slower of the two is paid.
        fetched = staged * (1 - plan.host_share)
        seconds = max(0.0, fetched / (gbps * 1e9) - fetched / (plan.h2d_gbps * 1e9))
    return dataclasses.replace(plan, pin_limit=limit, pinned_bytes=pinned + ring, staged_bytes=staged,
                               staging_seconds=seconds)


@functools.cache
def measure_memcpy_gbps(num_bytes: int = 64 << 20, repeats: int = 3) -> float:
    """Host memcpy rate (pageable -> pageable, torch's copy), the staging ring's own step; best of ``repeats``."""
    source, target = torch.ones(num_bytes, dtype=torch.uint8), torch.empty(num_bytes, dtype=torch.uint8)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - started)
    gbps = num_bytes / best / 1e9
    logger.info("host memcpy %.1f GB/s (the staging ring's step)", gbps)
    return gbps
