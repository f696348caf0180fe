"""The hardware ceilings every floor is computed from, measured once per run on CUDA.

- pinned host->device and device->host bandwidth (>= 1 GiB each), and both directions at once
- a large bf16 matmul's TFLOP/s
- ``engine.kv.kernels.attend`` (the kernel the engine uses) on one head group: a prefill chunk against a long past
- how much pinned host memory can really be allocated (it can fail before ``free`` says memory is gone)
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


def matmul_rate(n: int = 8192, repeats: int = 10) -> dict:
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    seconds, _ = median_seconds(lambda: a @ b, "cuda", warmup=3, repeats=repeats)
    return {"matmul_n": n, "matmul_tflops": 2 * n**3 / seconds / 1e12}


def attention_rate(keys: int = 131072, chunk: int = 4096, head_dim: int = 128, n_rep: int = 4,
                   group_sizes: tuple[int, ...] = (1, 8), repeats: int = 5) -> dict:
    """TFLOP/s of ``kernels.attend`` for a ``chunk``-token query block against ``keys`` keys (bottom-right causal)."""
    result = {"attention_keys": keys, "attention_chunk": chunk, "attention_backend": _backend_name()}
    for group in group_sizes:
        query = torch.randn(1, group * n_rep, chunk, head_dim, dtype=torch.bfloat16, device="cuda")
        key = torch.randn(1, group, keys, head_dim, dtype=torch.bfloat16, device="cuda")
        value = torch.randn_like(key)
        run = lambda: kernels.attend(query, key, value, q_offset=keys - chunk, scaling=head_dim**-0.5)  # noqa: E731
        seconds, _ = median_seconds(run, "cuda", warmup=2, repeats=repeats)
        flops = attention_flops(chunk, keys, group * n_rep, head_dim)
        result[f"attention_tflops_g{group}"] = flops / seconds / 1e12
        del query, key, value
    release_memory("cuda")
    return result


def pinned_host_capacity(step_gib: int = 4, reserve_gib: int = 8, limit_gib: int | None = None) -> dict:
    """Allocates pinned host memory in ``step_gib`` blocks until one fails or only ``reserve_gib`` would remain.

    Stops short of the OOM killer: the ceiling is what ``psutil`` and the cgroup say is available, minus a reserve.
    """
    available = min(psutil.virtual_memory().available, _cgroup_available() or 1 << 62)
    ceiling = max(0, available - reserve_gib * _GIB)
    if limit_gib is not None:
        ceiling = min(ceiling, limit_gib * _GIB)
    blocks, failure, started = [], None, time.monotonic()
    try:
        while (len(blocks) + 1) * step_gib * _GIB <= ceiling:
            try:
                blocks.append(torch.empty(step_gib * _GIB, dtype=torch.uint8, pin_memory=True))
            except RuntimeError as exc:
                failure = str(exc).splitlines()[0][:200]
                break
    finally:
        pinned = len(blocks) * step_gib * _GIB
        blocks.clear()
        release_memory("cuda")
    logger.info("pinned %.0f GiB in %.1f s (available %.0f GiB)", pinned / _GIB, time.monotonic() - started,
                available / _GIB)
    return {"host_available_bytes": available, "host_pinned_ok_bytes": pinned, "host_pinned_failure": failure,
            "host_pinned_stopped_at_reserve": failure is None, "host_pinned_seconds": time.monotonic() - started}


def measure_all(*, copy_gib: float = 1.0, host_probe: bool = True) -> dict:
    metrics = {}
    metrics.update(link_bandwidth(int(copy_gib * _GIB)))
    metrics.update(matmul_rate())
    metrics.update(attention_rate())
    if host_probe:
        metrics.update(pinned_host_capacity())
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
