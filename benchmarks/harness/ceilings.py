"""The hardware ceilings every floor is computed from, measured once per run on CUDA.

- pinned host->device and device->host bandwidth (>= 1 GiB each), and both directions at once
- a large bf16 matmul's TFLOP/s
- ``engine.kv.kernels.attend`` (the kernel the engine uses) on one head group: a prefill chunk against a long past
- how much host memory the KV store may pin: a few GiB really pinned (the rate, and that pinning works at all),
  the rest computed from what RAM and the memory cgroup say is available, less a reserve. Pinning all of it to
  find out took 98.6 s of a 10-minute GPU call on the first H200 run (116 GiB, page-locked 4 GiB at a time on
  one thread); the few GiB take seconds and the figure is the same where the probe succeeds.

The whole step takes under 15 s on an H100/H200. ``measure_all(device="cpu")`` runs the same plumbing on a
CPU with tiny sizes (the CPU smoke run): no link, pageable memory for the probe.
"""

from __future__ import annotations

import logging
import time

import psutil
import torch

from engine.kv import kernels

from .floors import attention_flops
from .timing import median_seconds, release_memory

logger = logging.getLogger(__name__)

_GIB = 1 << 30


def link_bandwidth(num_bytes: int = _GIB, repeats: int = 5) -> dict:
    """GB/s (1e9) of pinned copies: each direction alone, then both at once on two streams."""
    host_in = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True).random_()
    host_out = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)
    device_in = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    device_out = torch.empty(num_bytes, dtype=torch.uint8, device="cuda").random_()
    h2d, _ = median_seconds(lambda: device_in.copy_(host_in, non_blocking=True), "cuda", repeats=repeats)
    d2h, _ = median_seconds(lambda: host_out.copy_(device_out, non_blocking=True), "cuda", repeats=repeats)
    up, down = torch.cuda.Stream(), torch.cuda.Stream()

    def both():
        # Both copies must start after whatever the current stream did, and the timer's end must wait for both.
        current = torch.cuda.current_stream()
        up.wait_stream(current)
        down.wait_stream(current)
        with torch.cuda.stream(up):
            device_in.copy_(host_in, non_blocking=True)
        with torch.cuda.stream(down):
            host_out.copy_(device_out, non_blocking=True)
        current.wait_stream(up)
        current.wait_stream(down)

    duplex, _ = median_seconds(both, "cuda", repeats=repeats)
    result = {"copy_bytes": num_bytes, "h2d_gbps": num_bytes / h2d / 1e9, "d2h_gbps": num_bytes / d2h / 1e9,
              "duplex_gbps": 2 * num_bytes / duplex / 1e9, "duplex_h2d_gbps": num_bytes / duplex / 1e9}
    del host_in, host_out, device_in, device_out
    release_memory("cuda")
    return result


def matmul_rate(n: int = 8192, repeats: int = 10, device: str = "cuda") -> dict:
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    seconds, _ = median_seconds(lambda: a @ b, device, warmup=3, repeats=repeats)
    return {"matmul_n": n, "matmul_tflops": 2 * n**3 / seconds / 1e12}


def attention_rate(keys: int = 131072, chunk: int = 4096, head_dim: int = 128, n_rep: int = 4,
                   group_sizes: tuple[int, ...] = (1, 8), repeats: int = 5, device: str = "cuda") -> dict:
    """TFLOP/s of ``kernels.attend`` for a ``chunk``-token query block against ``keys`` keys (bottom-right causal)."""
    result = {"attention_keys": keys, "attention_chunk": chunk, "attention_backend": _backend_name()}
    for group in group_sizes:
        query = torch.randn(1, group * n_rep, chunk, head_dim, dtype=torch.bfloat16, device=device)
        key = torch.randn(1, group, keys, head_dim, dtype=torch.bfloat16, device=device)
        value = torch.randn_like(key)
        run = lambda: kernels.attend(query, key, value, q_offset=keys - chunk, scaling=head_dim**-0.5)  # noqa: E731
        seconds, _ = median_seconds(run, device, warmup=2, repeats=repeats)
        flops = attention_flops(chunk, keys, group * n_rep, head_dim)
        result[f"attention_tflops_g{group}"] = flops / seconds / 1e12
        del query, key, value
    release_memory(device)
    return result


def host_capacity(probe_gib: float = 4.0, reserve_gib: float = 8.0, block_gib: float = 1.0,
                  pin: bool = True) -> dict:
    """Pins ``probe_gib`` of host memory in ``block_gib`` blocks (timed), then computes the KV store's host budget.

    The budget (``host_pinned_ok_bytes``, what ``benchmarks.harness.run`` plans with) is what ``psutil`` and the cgroup
    say is available less ``reserve_gib``, provided the probe pinned all it asked for; a probe that fails caps the
    budget at what it did pin. ``pin=False`` (a CPU without CUDA) allocates and touches pageable memory instead.
    """
    available = min(psutil.virtual_memory().available, _cgroup_available() or 1 << 62)
    ceiling = max(0, int(available - reserve_gib * _GIB))
    probe = min(int(probe_gib * _GIB), ceiling)
    block = max(1, int(block_gib * _GIB))
    blocks, failure, started = [], None, time.monotonic()
    try:
        while sum(b.numel() for b in blocks) + block <= probe:
            try:
                if pin:
                    blocks.append(torch.empty(block, dtype=torch.uint8, pin_memory=True))
                else:
                    blocks.append(torch.empty(block, dtype=torch.uint8).fill_(1))  # touched: really resident
            except RuntimeError as exc:
                failure = str(exc).splitlines()[0][:200]
                break
    finally:
        probed = sum(b.numel() for b in blocks)
        seconds = time.monotonic() - started
        blocks.clear()
        if pin:
            release_memory("cuda")
    budget = probed if failure is not None else ceiling
    logger.info("pinned %.1f GiB in %.2f s; host budget for KV %.0f GiB (available %.0f GiB, reserve %.0f GiB)",
                probed / _GIB, seconds, budget / _GIB, available / _GIB, reserve_gib)
    return {"host_available_bytes": available, "host_pinned_ok_bytes": budget, "host_pinned_failure": failure,
            "host_pinned_probe_bytes": probed, "host_pinned_seconds": seconds,
            "host_pin_gbps": probed / seconds / 1e9 if seconds > 0 else None,
            "host_pinned_is_probe": failure is None, "host_reserve_bytes": int(reserve_gib * _GIB),
            "host_pinned_kind": "pinned" if pin else "pageable"}


def measure_all(*, copy_gib: float = 1.0, host_probe: bool = True, device: str = "cuda", scale: float = 1.0) -> dict:
    """Every ceiling on ``device``; ``scale`` < 1 shrinks the sizes (the CPU smoke run)."""
    if device == "cuda":
        metrics = {}
        metrics.update(link_bandwidth(int(copy_gib * _GIB)))
        metrics.update(matmul_rate())
        metrics.update(attention_rate())
        if host_probe:
            metrics.update(host_capacity())
        return metrics
    # The plumbing on a CPU: no link to measure, the rest at sizes a CI machine runs in a second.
    metrics = matmul_rate(n=max(64, int(8192 * scale)), repeats=2, device=device)
    metrics.update(attention_rate(keys=max(256, int(131072 * scale)), chunk=64, repeats=2, device=device))
    if host_probe:
        metrics.update(host_capacity(probe_gib=max(1 / 64, 4.0 * scale), block_gib=1 / 64, pin=False))
    return metrics


def _cgroup_available() -> int | None:
    """Bytes the memory cgroup still allows (containers often have less than the machine's RAM)."""
    try:
        limit = open("/sys/fs/cgroup/memory.max").read().strip()
        used = int(open("/sys/fs/cgroup/memory.current").read().strip())
    except OSError:
        return None
    return None if limit == "max" else int(limit) - used


def _backend_name() -> str:
    return "flash-attn" if kernels._flash_attn_func() is not None else "torch-sdpa"
