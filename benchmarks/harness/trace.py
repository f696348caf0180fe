"""A torch.profiler look at one decode step and one prefill chunk: do H2D copies overlap the attention kernels?

overlap = time during which a host-to-device memcpy and a kernel run at once / total host-to-device memcpy time,
computed from the exported trace's device events (``overlap_fraction`` is pure, for tests).
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from .fill import fill_random
from .models import random_ids
from .modes import Mode, Runner
from .timing import release_memory

logger = logging.getLogger(__name__)


def merge_intervals(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, non-overlapping union of [start, end) intervals."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def overlap_fraction(events: list[dict]) -> dict:
    """From chrome-trace events ({cat, name, ts, dur} in µs): H2D memcpy time, and the part of it with a kernel
    running concurrently. Kernel time is the union over all streams."""
    copies = [(e["ts"], e["ts"] + e["dur"]) for e in events if _is_h2d(e)]
    kernels = merge_intervals([(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "kernel"])
    copy_time = sum(end - start for start, end in merge_intervals(copies))
    overlapped = 0.0
    for start, end in merge_intervals(copies):
        for k_start, k_end in kernels:
            if k_start >= end:
                break
            overlapped += max(0.0, min(end, k_end) - max(start, k_start))
    kernel_time = sum(end - start for start, end in kernels)
    return {"h2d_us": copy_time, "h2d_overlapped_us": overlapped, "kernel_us": kernel_time,
            "overlap": overlapped / copy_time if copy_time else None}


def _is_h2d(event: dict) -> bool:
    name = event.get("name", "")
    return event.get("cat") in ("gpu_memcpy", "Memcpy") and ("HtoD" in name or "Host to Device" in name)


def profile_headinfer(runner: Runner, mode: Mode, capacity: int, table_path: Path | None = None) -> dict:
    """Profiles one decode step and one prefill chunk on a cache of ``capacity`` tokens filled to just below
    (room left for the chunk); returns overlap summaries. The key_averages tables go to ``table_path``."""

    runner.use(mode)
    shape = runner.shape
    chunk = min(runner.chunk_size, capacity // 2)
    context = capacity - chunk - 8
    cache = runner.make_cache(mode, capacity)
    fill_random(cache, context, head_dim=shape.head_dim, num_kv_heads=shape.num_kv_heads,
                device=runner.device, dtype=runner.dtype)
    ids = random_ids(runner.model, chunk + 4, device=runner.device, seed=2)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if runner.is_cuda else [])
    summary, tables = {}, []
    with torch.inference_mode():
        for _ in range(2):  # warm-up: kernels selected, buffers allocated
            runner.decode_step(cache, ids[:, :1])
        for name, step in (("decode_step", lambda: runner.decode_step(cache, ids[:, 1:2])),
                           ("prefill_chunk", lambda: runner.forward(ids[:, 4 : 4 + chunk], cache))):
            with profile(activities=activities) as prof:
                step()
                if runner.is_cuda:
                    torch.cuda.synchronize()
            events = _trace_events(prof)
            summary[name] = overlap_fraction(events)
            tables.append(f"## {name} ({mode.name}, {context} cached tokens)\n{_table(prof)}\n")
    del cache
    release_memory(runner.device)
    if table_path is not None:
        table_path.parent.mkdir(parents=True, exist_ok=True)
        table_path.write_text("\n".join(tables))
    return {**summary, "kv_tokens": context, "chunk": chunk}


def _trace_events(prof) -> list[dict]:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def _table(prof) -> str:
    averages = prof.key_averages()
    for sort_by in ("device_time_total", "cuda_time_total", "cpu_time_total"):
        try:
            return averages.table(sort_by=sort_by, row_limit=25)
        except (KeyError, AttributeError, ValueError):
            continue
    return averages.table(row_limit=25)
