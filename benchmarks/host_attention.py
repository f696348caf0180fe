"""``python -m benchmarks.host_attention``: the host attention kernel's GB/s against this machine's read bandwidth.

CPU table (issue 12): a decode step's host attention over one head group's bf16 home (head dim 128, GQA with 4
query heads per KV head, as Llama-3-8B) at 8K-512K tokens per group, on every core, next to a STREAM-like read
of a large buffer measured in the same run; written to ``docs/benchmarks/host-attention-cpu.{md,json}``::

    python -m benchmarks.host_attention                      # 8K,32K,128K,512K; groups of 1 and 8 KV heads
    python -m benchmarks.host_attention --tokens 8K,32K --groups 1 --out /tmp/bench

GPU (``gpu_step``, run by ``benchmarks.gpu_all`` as its ``host-attention`` step): the same two CPU figures, then
decode s/token of Llama-3-8B at 32K, 128K, 512K with every group streamed, with the planner's split, and with
every group on the host, each as a ratio to the PCIe floor (the report computes the ratios).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

GPU_DECODE_ARGS = ["--phases", "decode", "--modes", "headinfer-g1,headinfer-g1-split,headinfer-g1-host",
                   "--decode-lengths", "32K,128K,512K", "--decode-steps", "4", "--repeats", "2"]


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm: workers started, their tile buffers allocated, pages touched
    samples = []
    for _ in range(repeats):
        begin = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - begin)
    return statistics.median(samples)


def read_bandwidth(num_bytes: int = 1 << 30, repeats: int = 5) -> dict:
    """GB/s of reading a buffer far larger than the caches: torch's multi-threaded sum, and the host kernel's
    own workers each summing a slice (the same threads the kernel runs on). The larger is the machine's figure."""
    from engine.kv.workers import shared_workers

    data = torch.empty(num_bytes // 4, dtype=torch.float32).normal_()
    torch_sum = num_bytes / median_seconds(data.sum, repeats) / 1e9
    workers = shared_workers()
    slices = data.chunk(workers.num_threads)

    def pooled():
        for future in [workers.submit(torch.sum, part) for part in slices]:
            future.result()

    pooled_sum = num_bytes / median_seconds(pooled, repeats) / 1e9
    return {"read_gbps": max(torch_sum, pooled_sum), "torch_sum_gbps": torch_sum, "worker_sum_gbps": pooled_sum,
            "read_bytes": num_bytes, "threads": workers.num_threads}


def kernel_gbps(tokens: int, group_size: int = 1, n_rep: int = 4, head_dim: int = 128,
                dtype: torch.dtype = torch.bfloat16, repeats: int = 5) -> dict:
    """One decode query row per query head over a home of ``tokens`` tokens: home bytes read per second."""
    from engine.kv import HostAttention

    home = torch.empty(tokens, 1, 2, group_size, head_dim, dtype=dtype).normal_()  # [S, B, 2, g, D]
    query = torch.randn(1, group_size * n_rep, 1, head_dim, dtype=dtype)
    kernel = HostAttention()
    seconds = median_seconds(lambda: kernel.attend(query, [home], 0, tokens, scaling=head_dim**-0.5), repeats)
    return {"tokens": tokens, "group_size": group_size, "n_rep": n_rep, "home_bytes": home.nbytes,
            "seconds": seconds, "gbps": home.nbytes / seconds / 1e9}


def run_cpu(tokens: list[int], groups: list[int], repeats: int, read_bytes: int = 1 << 30) -> dict:
    from .records import run_stamp

    stamp = run_stamp("cpu")
    before = read_bandwidth(read_bytes, repeats)
    rows = [kernel_gbps(t, g, repeats=repeats) for g in groups for t in tokens]
    after = read_bandwidth(read_bytes, repeats)  # twice: other work on the machine moves the figure
    read = max(before["read_gbps"], after["read_gbps"])
    for row in rows:
        row["x_read"] = row["gbps"] / read
    return {"run": stamp, "read": {**before, "read_gbps": read, "read_gbps_before": before["read_gbps"],
                                   "read_gbps_after": after["read_gbps"]},
            "rows": rows, "target_x_read": 0.6}


def write_report(result: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "host-attention-cpu.json").write_text(json.dumps(result, indent=1))
    run, read = result["run"], result["read"]
    lines = [
        "# Host attention kernel vs read bandwidth (CPU)",
        "",
        f"{run['date']} · {run['machine']} · torch {run['torch']} · load average {run['load_avg']}",
        "",
        f"Read bandwidth (STREAM-like, {read['read_bytes'] >> 20} MiB fp32, best of torch's sum and "
        f"{read['threads']} workers each summing a slice; before/after the kernel rows): "
        f"**{read['read_gbps']:.1f} GB/s** ({read['read_gbps_before']:.1f} / {read['read_gbps_after']:.1f}).",
        "",
        "Kernel: one decode step of `engine.kv.HostAttention` over a bf16 home `[S, 1, 2, g, 128]`, 4 query heads",
        "per KV head, on the shared pool (one worker per core). GB/s = home bytes read per second.",
        "",
        "| KV heads per group | tokens | home MiB | ms | GB/s | × read |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        lines.append(f"| {row['group_size']} | {row['tokens'] // 1024}K | {row['home_bytes'] / 2**20:.0f} | "
                     f"{row['seconds'] * 1e3:.1f} | {row['gbps']:.2f} | {row['x_read']:.2f} |")
    lines += ["", f"Target: ≥ {result['target_x_read']:.0%} of the read bandwidth on all cores.", ""]
    path = out / "host-attention-cpu.md"
    path.write_text("\n".join(lines))
    return path


def gpu_step(args, store, out: Path, seconds: float) -> None:
    """``benchmarks.gpu_all``'s ``host-attention`` step: host figures, then decode with three splits."""
    from .gpu_all import _run_step

    started = time.monotonic()
    read_bytes = 1 << 30 if args.scale >= 1 else 64 << 20  # the CPU smoke run (a tiny scale) keeps CI fast
    store.append("host-attention", "read", **read_bandwidth(num_bytes=read_bytes, repeats=3))
    for tokens in (1 << 15, 1 << 17):
        row = kernel_gbps(max(1024, int(tokens * args.scale)), repeats=3)
        store.append("host-attention", "kernel", context=row["tokens"], **row)
    _run_step(args, GPU_DECODE_ARGS, store, out, max(10.0, seconds - (time.monotonic() - started)))


def main(argv=None) -> int:
    from .run import parse_tokens

    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_attention", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="8K,32K,128K,512K", help="tokens per head group")
    parser.add_argument("--groups", default="1,8", help="KV heads per group")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--read-mib", type=int, default=1024, help="size of the STREAM-like read buffer")
    parser.add_argument("--out", default="docs/benchmarks")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = run_cpu(parse_tokens(args.tokens), [int(g) for g in args.groups.split(",")], args.repeats,
                     args.read_mib << 20)
    print(write_report(result, Path(args.out)).read_text())  # a benchmark script prints its table
    return 0


if __name__ == "__main__":
    sys.exit(main())
