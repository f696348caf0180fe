"""The two rates a decode split is planned from, measured once per machine and cached on disk.

- host attention GB/s: ``kv.host_attention`` over a bf16 home larger than the CPU caches (Llama-3-8B's head
  dim, one KV head per group), on every core: bytes of home read per second;
- H2D GB/s: a pinned host-to-device copy on CUDA, measured while host attention runs (both read DRAM, as in a
  decode step: ``measure_together``). Without CUDA there is no link to measure, and
  ``DEFAULT_H2D_GBPS`` stands in (PCIe 4.0 x16, as on the paper's RTX 4090) so that a plan can still be shown.

The figures are cached in ``<studio cache>/machine-rates.json`` under a key naming the machine (host, CPU,
cores, torch, GPU): a different machine, or a new torch, measures again.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..kv.host_attention import HostAttention
from ..paths import cache_dir
from .host_split import DEFAULT_H2D_GBPS
from .policy import OffloadPolicy

logger = logging.getLogger(__name__)

_PROBE_TOKENS = 1 << 18  # 64 MiB of bf16 home at head dim 128: well beyond any L3 cache
_PROBE_REPEATS = 5
_FILE = "machine-rates.json"


@dataclass(frozen=True)
class MachineRates:
    """Measured GB/s (1e9 bytes/s): host attention over a home, and host-to-device copies."""

    host_attention_gbps: float
    h2d_gbps: float
    is_h2d_measured: bool


def plan_rates(policy: OffloadPolicy, device: torch.device | str) -> MachineRates | None:
    """The rates a plan needs: only on CUDA with host attention on (CPU compute has no split to plan)."""
    if policy.host_attention == "off" or torch.device(device).type != "cuda":
        return None
    return machine_rates(device)


def machine_rates(device: torch.device | str = "cpu", cache_path: Path | None = None) -> MachineRates:
    """This machine's rates: read from the cache file, or measured (about a second) and stored there."""
    device = torch.device(device)
    path = cache_path or _default_path()
    key = machine_key(device)
    cached = _read(path).get(key)
    if cached is not None:
        return MachineRates(**cached)
    is_cuda = device.type == "cuda"
    if is_cuda:  # both read DRAM: measured at once, as a decode step runs them
        rates = MachineRates(*measure_together_gbps(device), True)
    else:
        rates = MachineRates(measure_host_attention_gbps(), DEFAULT_H2D_GBPS, False)
    logger.info("measured machine rates: host attention %.1f GB/s, H2D %.1f GB/s%s", rates.host_attention_gbps,
                rates.h2d_gbps, "" if is_cuda else " (default: no CUDA)")
    _write(path, key, rates)
    return rates


def machine_key(device: torch.device) -> str:
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "no-gpu"
    # "together": measured at once since rates v2 (figures measured apart are not reused)
    return f"{platform.node()}|{cpu_model()}|{os.cpu_count()} cpus|torch {torch.__version__}|{gpu}|together"


def measure_together(host_step: Callable[[], int], link_step: Callable[[], tuple[int, float]],
                     repeats: int = _PROBE_REPEATS) -> tuple[float, float]:
    """(host GB/s, link GB/s) with both running at once: ``host_step()`` (one host-attention pass, returns the bytes
    it read) loops on a thread for as long as ``repeats`` calls of ``link_step()`` (a timed batch of H2D copies,
    returns (bytes, seconds)) run on this one. Medians; the host's first pass (a warm-up) is not counted."""
    stop = threading.Event()
    host: list[tuple[int, float]] = []

    def loop() -> None:
        while True:  # at least two passes: the warm-up and one measured beside the copies
            begin = time.perf_counter()
            num = host_step()
            host.append((num, time.perf_counter() - begin))
            if stop.is_set() and len(host) >= 2:
                return

    thread = threading.Thread(target=loop, name="rates-host", daemon=True)
    thread.start()
    try:
        link = [link_step() for _ in range(repeats)]
    finally:
        stop.set()
        thread.join()
    host_rates = [num / max(seconds, 1e-9) for num, seconds in host[1:]]
    link_rates = [num / max(seconds, 1e-9) for num, seconds in link]
    return statistics.median(host_rates) / 1e9, statistics.median(link_rates) / 1e9


def measure_together_gbps(device: torch.device, tokens: int = _PROBE_TOKENS, num_bytes: int = 256 << 20,
                          copies_per_step: int = 4) -> tuple[float, float]:
    """Host attention and pinned H2D copies measured at once on CUDA (``measure_together``)."""
    home = torch.empty(tokens + 1, 1, 2, 1, 128, dtype=torch.bfloat16).normal_()
    query = torch.randn(1, 4, 1, 128, dtype=torch.bfloat16)
    kernel = HostAttention()
    source = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True).random_()
    target = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    stream = torch.cuda.Stream(device)

    def host_step() -> int:
        kernel.attend(query, [home], 0, tokens + 1, scaling=128**-0.5)
        return home.nbytes

    def link_step() -> tuple[int, float]:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            begin.record(stream)
            for _ in range(copies_per_step):
                target.copy_(source, non_blocking=True)
            end.record(stream)
        end.synchronize()
        return num_bytes * copies_per_step, begin.elapsed_time(end) / 1e3

    with torch.cuda.stream(stream):
        target.copy_(source, non_blocking=True)  # warm-up
    stream.synchronize()
    return measure_together(host_step, link_step)


def measure_host_attention_gbps(tokens: int = _PROBE_TOKENS, group_size: int = 1, head_dim: int = 128,
                                n_rep: int = 4, repeats: int = _PROBE_REPEATS) -> float:
    """Home bytes per second the host kernel reads in a decode step (median of ``repeats``)."""
    home = torch.empty(tokens + 1, 1, 2, group_size, head_dim, dtype=torch.bfloat16).normal_()
    query = torch.randn(1, group_size * n_rep, 1, head_dim, dtype=torch.bfloat16)
    kernel = HostAttention()
    samples = []
    for _ in range(repeats + 1):  # the first pass warms the workers' buffers
        begin = time.perf_counter()
        kernel.attend(query, [home], 0, tokens + 1, scaling=head_dim**-0.5)
        samples.append(time.perf_counter() - begin)
    return home.nbytes / statistics.median(samples[1:]) / 1e9


def measure_h2d_gbps(device: torch.device, num_bytes: int = 256 << 20, repeats: int = _PROBE_REPEATS) -> float:
    """Pinned host-to-device copy rate (median), timed with CUDA events."""
    source = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True).random_()
    return measure_copy_gbps(torch.empty(num_bytes, dtype=torch.uint8, device=device), source, repeats)


def measure_copy_gbps(target: torch.Tensor, source: torch.Tensor, repeats: int = _PROBE_REPEATS) -> float:
    """Rate of ``target.copy_(source, non_blocking=True)`` (median), timed with CUDA events."""
    num_bytes = source.nbytes
    target.copy_(source, non_blocking=True)  # warm-up
    samples = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        target.copy_(source, non_blocking=True)
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end) / 1e3)
    return num_bytes / statistics.median(samples) / 1e9


def _default_path() -> Path:
    return cache_dir() / _FILE


def cpu_model() -> str:
    """The CPU's model name (what a measured rate belongs to)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write(path: Path, key: str, rates: MachineRates) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = {**_read(path), key: asdict(rates)}
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(entries, indent=1))
        temporary.replace(path)  # atomic: a concurrent reader sees the old file or the new one
    except OSError as error:  # a read-only home only costs a re-measurement next time
        logger.warning("could not cache machine rates in %s: %s", path, error)
