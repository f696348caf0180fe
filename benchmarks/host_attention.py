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

from engine.kv import HostAttention
from engine.kv.workers import shared_workers

from .records import run_stamp
from .run import parse_tokens, run_step

logger = logging.getLogger(__name__)

GPU_DECODE_ARGS = ["--phases", "decode", "--modes", "headinfer-g1,headinfer-g1-split,headinfer-g1-host",
                   "--decode-lengths", "32K,128K,512K", "--decode-steps", "4", "--repeats", "2"]


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm: workers started, their buffers allocated, pages touched
    samples = []
    for _ in range(repeats):
        begin = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - begin)
    return statistics.median(samples)


class StreamRead:
    """A STREAM-like read of a buffer far larger than the caches, on every core: the kernel's own workers each
    sum a slice (single-threaded, vectorised), and torch's multi-threaded sum; the faster of the two counts."""

    def __init__(self, num_bytes: int = 1 << 30):
        self.data = torch.empty(num_bytes // 4, dtype=torch.float32).normal_()
        self.workers = shared_workers()
        self.slices = self.data.chunk(self.workers.num_threads)

    def pooled(self) -> None:
        for future in [self.workers.submit(torch.sum, part) for part in self.slices]:
            future.result()

    def seconds(self) -> float:
        return min(_timed(self.pooled), _timed(self.data.sum))

    def cpu_seconds(self) -> float:
        """CPU time (all threads) of the workers' read: no OpenMP team spinning, like the kernel."""
        return _timed(self.pooled, clock=time.process_time)


def _timed(fn, clock=time.perf_counter) -> float:
    begin = clock()
    fn()
    return clock() - begin


def read_bandwidth(num_bytes: int = 1 << 30, repeats: int = 5) -> dict:
    """GB/s of the STREAM-like read (median of ``repeats``)."""
    read = StreamRead(num_bytes)
    read.seconds()
    seconds = statistics.median(read.seconds() for _ in range(repeats))
    return {"read_gbps": num_bytes / seconds / 1e9, "read_bytes": num_bytes, "threads": read.workers.num_threads}


def kernel_gbps(tokens: int, group_size: int = 1, n_rep: int = 4, head_dim: int = 128,
                dtype: torch.dtype = torch.bfloat16, repeats: int = 5, read: StreamRead | None = None) -> dict:
    """One decode query row per query head over a home of ``tokens`` tokens: home bytes read per second.

    With ``read``, each timed call alternates with a STREAM-like read, so both see the same load from other
    processes; the row then carries the read's GB/s and the ratio.
    """

    home = torch.empty(tokens, 1, 2, group_size, head_dim, dtype=dtype).normal_()  # [S, B, 2, g, D]
    query = torch.randn(1, group_size * n_rep, 1, head_dim, dtype=dtype)
    kernel = HostAttention()

    def step():
        kernel.attend(query, [home], 0, tokens, scaling=head_dim**-0.5)

    step()  # warm: workers started, their buffers allocated, pages touched
    kernel_samples, kernel_cpu, read_samples, read_cpu = [], [], [], []
    for _ in range(repeats):
        kernel_samples.append(_timed(step))
        kernel_cpu.append(_timed(step, clock=time.process_time))
        if read is not None:
            read_samples.append(read.seconds())
            read_cpu.append(read.cpu_seconds())
    seconds = statistics.median(kernel_samples)
    row = {"tokens": tokens, "group_size": group_size, "n_rep": n_rep, "home_bytes": home.nbytes,
           "seconds": seconds, "gbps": home.nbytes / seconds / 1e9,
           "gb_per_cpu_s": home.nbytes / statistics.median(kernel_cpu) / 1e9}
    if read is not None:
        row["read_gbps"] = read.data.nbytes / statistics.median(read_samples) / 1e9
        row["x_read"] = row["gbps"] / row["read_gbps"]
        # Per CPU-second, both on the same workers: what the wall ratio becomes when no other process competes
        # for the cores (on a loaded machine the wall figures measure the scheduler as much as the kernel).
        row["read_gb_per_cpu_s"] = read.data.nbytes / statistics.median(read_cpu) / 1e9
        row["x_read_cpu"] = row["gb_per_cpu_s"] / row["read_gb_per_cpu_s"]
    return row


def run_cpu(tokens: list[int], groups: list[int], repeats: int, read_bytes: int = 1 << 30) -> dict:
    stamp = run_stamp("cpu")
    read = StreamRead(read_bytes)
    read.seconds()
    rows = [kernel_gbps(t, g, repeats=repeats, read=read) for g in groups for t in tokens]
    return {"run": stamp, "read": {"read_bytes": read_bytes, "threads": read.workers.num_threads,
                                   "read_gbps": max(row["read_gbps"] for row in rows)},
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
        f"Kernel: one decode step of `engine.kv.HostAttention` over a bf16 home `[S, 1, 2, g, 128]`, 4 query heads",
        f"per KV head, on the shared pool ({read['threads']} workers, one per core). GB/s = home bytes read per second.",
        f"Read: a STREAM-like read of {read['read_bytes'] >> 20} MiB fp32 on every core (the workers each summing a",
        "slice, or torch's multi-threaded sum, whichever is faster), timed alternately with the kernel so that",
        "both see the same load from other processes. Medians. Per CPU-second: bytes over the CPU time all",
        "threads spent (the kernel's workers, and the same workers reading): the ratio the wall figures reach",
        "when no other process competes for the cores.",
        "",
        "| KV heads per group | tokens | home MiB | ms | GB/s | read GB/s | × read | GB per CPU-s | read GB per CPU-s"
        " | × read per CPU-s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        lines.append(f"| {row['group_size']} | {row['tokens'] // 1024}K | {row['home_bytes'] / 2**20:.0f} | "
                     f"{row['seconds'] * 1e3:.1f} | {row['gbps']:.2f} | {row['read_gbps']:.1f} | {row['x_read']:.2f} | "
                     f"{row['gb_per_cpu_s']:.2f} | {row['read_gb_per_cpu_s']:.2f} | {row['x_read_cpu']:.2f} |")
    lines += ["", f"Target: ≥ {result['target_x_read']:.0%} of the read bandwidth on all cores.", ""]
    path = out / "host-attention-cpu.md"
    path.write_text("\n".join(lines))
    return path


def gpu_step(args, store, out: Path, seconds: float) -> None:
    """``benchmarks.gpu_all``'s ``host-attention`` step: host figures, then decode with three splits."""
    started = time.monotonic()
    read_bytes = 1 << 30 if args.scale >= 1 else 64 << 20  # the CPU smoke run (a tiny scale) keeps CI fast
    read = StreamRead(read_bytes)
    store.append("host-attention", "read", **read_bandwidth(num_bytes=read_bytes, repeats=3))
    for tokens in (1 << 15, 1 << 17):
        row = kernel_gbps(max(1024, int(tokens * args.scale)), repeats=3, read=read)
        store.append("host-attention", "kernel", context=row["tokens"], **row)
    run_step(args, GPU_DECODE_ARGS, store, out, max(10.0, seconds - (time.monotonic() - started)))


def main(argv=None) -> int:
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
