"""``python -m benchmarks.cpu.host_attention``: one layer's host attention call against this machine's read bandwidth.

CPU table (issue 29): one decode step's host attention over a whole Llama-3-8B layer (8 KV heads, one per group,
4 query heads each, head dim 128) at 1K-512K tokens, bf16 and int8 homes, on 1 thread and on every core, each call
timed alternately with a plain read of a large buffer on the same threads of the kernel's pool (so that both see
the same load from other processes); then the fixed cost of a call. Written to
``docs/benchmarks/host-attention-cpu.md`` (records: ``data/host-attention-cpu.json``)::
    python -m benchmarks.cpu.host_attention                      # 1K,8K,32K,128K,512K; bf16,int8; 1 thread, every core
    python -m benchmarks.cpu.host_attention --tokens 8K,32K --dtypes bf16 --threads 1 --out /tmp/bench

GPU (``gpu_step``, run by ``benchmarks.gpu.gpu_all`` as its ``host-attention`` step): the kernel's ratio to the read
on the machine's cores, then decode s/token of Llama-3-8B at 32K, 128K, 512K with every group streamed, with the
planner's split, and with every group on the host, each as a ratio to the PCIe floor (the report computes them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import logging
import statistics
import sys
import time
from pathlib import Path

import psutil
import torch

from engine.kv import HostAttention, native, quant
from engine.native.workers import usable_cores

from ..records import run_stamp
from ..harness.layout import data_file
from ..harness.run import parse_tokens, run_step

logger = logging.getLogger(__name__)

GPU_DECODE_ARGS = ["--phases", "decode", "--modes", "headinfer-g1-split,headinfer-g1-host,headinfer-g1",
                   "--decode-lengths", "32K,128K,512K", "--decode-steps", "4", "--repeats", "2"]
LLAMA3_8B = {"num_groups": 8, "n_rep": 4, "head_dim": 128}  # one KV head per group: head_group_size=1
TARGET_X_READ, TARGET_1K_MS = 0.7, 0.3


def _timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of every thread of this process) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


class Layer:
    """One layer's homes (bf16, fp32, or int8 codes with their scales) and a decode step's queries (bf16, fp32 for
    fp32 homes: a CPU model's)."""

    def __init__(self, tokens: int, dtype: str, num_groups: int = 8, n_rep: int = 4, head_dim: int = 128,
                 group: int = 1):
        # A random 16 MiB block repeated: filling gigabytes with random numbers would take longer than the run.
        torch.manual_seed(0)
        seed = torch.randn(min(tokens, 1 << 15), 1, 2, group, head_dim)  # [S, B, 2, g, D]
        seed = seed if dtype == "fp32" else seed.to(torch.bfloat16)
        codes, scales = quant.quantize(seed, "int8") if dtype == "int8" else (seed, None)
        self.kvs, self.scales = [], [] if scales is not None else None
        for _ in range(num_groups):
            self.kvs.append(_repeated(codes, tokens))
            if scales is not None:
                self.scales.append(_repeated(scales, tokens))
        self.query = torch.randn(1, num_groups * group * n_rep, 1, head_dim)  # [B, H, Q, D]
        self.query = self.query if dtype == "fp32" else self.query.to(torch.bfloat16)
        self.out = torch.empty_like(self.query)
        self.tokens = tokens
        self.home_bytes = sum(kv.nbytes for kv in self.kvs) + sum(s.nbytes for s in self.scales or [])

    def call(self, num_threads: int, function=None, prefetch: str | None = None) -> None:
        """``function``: a library from ``native.build`` (another build of the kernel) instead of the engine's;
        ``prefetch``: a level of ``native.PREFETCH`` instead of the environment's."""
        native.attend_layer(self.query, self.kvs, 0, self.tokens, self.out, scaling=self.query.shape[-1] ** -0.5,
                            scales=self.scales, num_threads=num_threads, function=function, prefetch=prefetch)


def _repeated(block: torch.Tensor, tokens: int) -> torch.Tensor:
    out = torch.empty(tokens, *block.shape[1:], dtype=block.dtype)
    for first in range(0, tokens, block.shape[0]):
        last = min(tokens, first + block.shape[0])
        out[first:last] = block[: last - first]
    return out


def in_turns(layer: Layer, calls: dict, read: "Read", num_threads: int, rounds: int, store, shape: str,
             dtype: str) -> None:
    """The layer's call once per entry of ``calls`` (name -> keyword arguments of ``Layer.call``: another build's
    ``function``, a ``prefetch`` level) on ``num_threads``, in turns in every round (which goes first alternates:
    ABBA, no order bias), each after a read of ``read``'s buffer (the layer leaves the caches, as a decode step's
    does); the read is timed in the same rounds. Prints and stores each call's median against the read."""
    for kwargs in calls.values():  # warm: the pool started, pages touched
        layer.call(num_threads, **kwargs)
    samples: dict[str, list[float]] = {name: [] for name in calls}
    reads = []
    order = list(calls.items())
    for round_index in range(rounds):
        for name, kwargs in order if round_index % 2 == 0 else order[::-1]:
            read.call(num_threads)
            begin = time.perf_counter()
            layer.call(num_threads, **kwargs)
            samples[name].append(time.perf_counter() - begin)
        begin = time.perf_counter()
        read.call(num_threads)
        reads.append(time.perf_counter() - begin)
    read_gbps = read.data.nbytes / statistics.median(reads) / 1e9
    for name, seconds in samples.items():
        median = statistics.median(seconds)
        gbps = layer.home_bytes / median / 1e9
        print(f"{shape} {dtype} {layer.tokens:,} x{num_threads or 'all'}: {name} {median * 1e3:.3f} ms, "
              f"{gbps:.2f} GB/s, {gbps / read_gbps:.3f} x the read", flush=True)
        store.append("layer", name, context=layer.tokens, variant=f"{shape}/{dtype}/{num_threads}", seconds=median,
                     gbps=gbps, read_gbps=read_gbps, samples=seconds)


def turns_table(records: list[dict], names: list[str]) -> list[str]:
    """The table of ``in_turns``'s records: per shape, home, tokens and threads, each name's ms, each later name's
    time over the first's, and each name's ratio to the read. Rows some name lacks are left out (a record of another
    benchmark's shape has no shape in its variant: left out too)."""
    rows = {(r["variant"], r["context"], r["mode"]): r["metrics"] for r in records
            if r.get("phase") == "layer" and (r.get("variant") or "").count("/") == 2}
    lines = ["| shape | home | tokens | threads | " + " | ".join(f"{n} ms" for n in names) + " | "
             + " | ".join(f"{n} / {names[0]}" for n in names[1:]) + " | "
             + " | ".join(f"{n} x read" for n in names) + " |",
             "|---|---|---:|---|" + "---:|" * (3 * len(names) - 1)]
    for variant, context in sorted({(v, c) for v, c, _ in rows}, key=lambda k: (k[0].rsplit("/", 1)[0], k[1], k[0])):
        cells = [rows.get((variant, context, name)) for name in names]
        if not all(cells):
            continue
        shape, dtype, threads = variant.split("/")
        ms = [c["seconds"] * 1e3 for c in cells]
        lines.append(f"| {shape} | {dtype} | {context:,} | {'every core' if threads == '0' else threads} | "
                     + " | ".join(f"{m:.3f}" for m in ms) + " | "
                     + " | ".join(f"{m / ms[0]:.3f}" for m in ms[1:]) + " | "
                     + " | ".join(f"{c['gbps'] / c['read_gbps']:.2f}" for c in cells) + " |")
    return lines


class Read:
    """A plain read of a buffer far larger than the caches, on the kernel's pool (``native.read``)."""

    def __init__(self, num_bytes: int):
        self.data = torch.ones(num_bytes // 4, dtype=torch.float32)

    def call(self, num_threads: int) -> None:
        native.read(self.data, num_threads)


@contextlib.contextmanager
def _path(name: str | None):
    """Calls in the block run on vector path ``name`` (None: as the environment says), as ``HEADINFER_HOST_KERNEL``
    would force it."""
    if name is None:
        yield
        return
    before = os.environ.get(native.ENV_PATH)
    os.environ[native.ENV_PATH] = name
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(native.ENV_PATH, None)
        else:
            os.environ[native.ENV_PATH] = before


def current_path() -> str:
    """The vector path a call runs now (the widest this CPU has, or the forced one)."""
    return {code: name for name, code in native.PATHS.items()}[native.kernel().variant(
        native.PATHS[native.forced_path()])]


def layer_rows(tokens: int, dtype: str, num_threads: int, read: Read, repeats: int,
               paths: list[str] | None = None) -> list[dict]:
    """One layer call of ``tokens`` tokens per group on each vector path of ``paths`` (None: the current one), the
    paths in turns, each call followed by the read: a row per path."""
    layer = Layer(tokens, dtype, **LLAMA3_8B)
    for path in paths or [None]:
        with _path(path):
            layer.call(num_threads), read.call(num_threads)  # warm: the pool started, pages touched
    samples = {path: ([], []) for path in paths or [None]}
    for _ in range(repeats):
        for path, (kernel, reads) in samples.items():
            with _path(path):
                kernel.append(_timed(lambda: layer.call(num_threads)))
                reads.append(_timed(lambda: read.call(num_threads)))
    rows = []
    for path, (kernel, reads) in samples.items():
        with _path(path):
            rows.append({"path": current_path(), **_row(layer, tokens, dtype, num_threads, read, kernel, reads)})
    return rows


def layer_row(tokens: int, dtype: str, num_threads: int, read: Read, repeats: int) -> dict:
    """One layer call of ``tokens`` tokens per group, alternating with the read: medians, wall and per CPU-second."""
    return layer_rows(tokens, dtype, num_threads, read, repeats)[0]


def _row(layer: Layer, tokens: int, dtype: str, num_threads: int, read: Read, kernel: list, reads: list) -> dict:
    seconds, cpu = (statistics.median(k[i] for k in kernel) for i in (0, 1))
    read_seconds, read_cpu = (statistics.median(r[i] for r in reads) for i in (0, 1))
    row = {"tokens": tokens, "dtype": dtype, "threads": num_threads, "home_bytes": layer.home_bytes,
           "seconds": seconds, "gbps": layer.home_bytes / seconds / 1e9,
           "read_gbps": read.data.nbytes / read_seconds / 1e9,
           "gb_per_cpu_s": layer.home_bytes / cpu / 1e9, "read_gb_per_cpu_s": read.data.nbytes / read_cpu / 1e9}
    row["x_read"] = row["gbps"] / row["read_gbps"]
    # Best of the repeats (least CPU time): on a machine shared with other processes the median CPU time also
    # counts the caches and memory bandwidth they take; the fastest repeat is the nearest to a quiet machine's.
    row["best_ms"] = min(k[0] for k in kernel) * 1e3
    row["best_gb_per_cpu_s"] = layer.home_bytes / min(k[1] for k in kernel) / 1e9
    row["best_read_gb_per_cpu_s"] = read.data.nbytes / min(r[1] for r in reads) / 1e9
    row["x_read_cpu_best"] = row["best_gb_per_cpu_s"] / row["best_read_gb_per_cpu_s"]
    # What the wall ratio becomes when no other process competes for the cores (on a loaded machine the wall
    # figures measure the scheduler as much as the kernel).
    row["x_read_cpu"] = row["gb_per_cpu_s"] / row["read_gb_per_cpu_s"]
    return row


def fixed_cost(repeats: int = 200) -> dict:
    """Microseconds per layer call at 16 tokens per group (8 groups): the C call alone on 1 thread and on every
    core, and through ``HostAttention.attend`` (the Python around it). Medians and minima."""
    layer = Layer(16, "bf16", **LLAMA3_8B)
    host = HostAttention()
    cases = {"c_call_1_thread": lambda: layer.call(1), "c_call_every_core": lambda: layer.call(0),
             "host_attention_attend": lambda: host.attend(layer.query, layer.kvs, 0, 16, scaling=0.088)}
    result = {}
    for name, fn in cases.items():
        fn()
        samples = [_timed(fn)[0] * 1e6 for _ in range(repeats)]
        result[name] = {"median_us": statistics.median(samples), "min_us": min(samples)}
    return result


def fits(tokens: int, dtype: str, read_bytes: int) -> bool:
    """Whether the layer (and the read buffer) fit in half the memory available now."""
    per_token = LLAMA3_8B["num_groups"] * 2 * LLAMA3_8B["head_dim"] * (2 if dtype == "bf16" else 1)
    return tokens * per_token + read_bytes < psutil.virtual_memory().available // 2


def run_cpu(tokens: list[int], dtypes: list[str], threads: list[int], repeats: int, read_bytes: int = 1 << 30,
            paths: list[str] | None = None) -> dict:
    stamp = run_stamp("cpu")
    stamp["path"] = ", ".join(paths) if paths else current_path()
    read = Read(read_bytes)
    rows, skipped = [], []
    for dtype in dtypes:
        for count in tokens:
            if not fits(count, dtype, read_bytes):
                skipped.append({"tokens": count, "dtype": dtype, "why": "not enough free memory"})
                continue
            for num_threads in threads:
                rows += layer_rows(count, dtype, num_threads, read, repeats, paths)
                logger.info("%s", rows[-1])
    return {"run": stamp, "shape": LLAMA3_8B, "read_bytes": read_bytes, "cores": usable_cores(), "rows": rows,
            "skipped": skipped, "fixed_cost": fixed_cost(), "target_x_read": TARGET_X_READ,
            "target_1k_ms": TARGET_1K_MS}


def write_report(result: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    data_file(out, "host-attention-cpu.json").write_text(json.dumps(result, indent=1))
    run, shape = result["run"], result["shape"]
    lines = [
        "# Host attention kernel vs read bandwidth (CPU)",
        "",
        f"{run['date']} · {run['machine']} · torch {run['torch']} · load average {run['load_avg']} · "
        f"vector path {run['path']}",
        "",
        f"Kernel: one decode step's host attention over a whole Llama-3-8B layer in one C call (`native.attend_layer`:"
        f" {shape['num_groups']} head groups of one KV head, {shape['n_rep']} query heads each, head dim "
        f"{shape['head_dim']}), bf16 homes or int8 codes with their fp32 scales, on 1 thread or every core "
        f"({result['cores']}) of the kernel's pool. GB/s = home bytes (scales included) read per second.",
        f"Read: a plain read of {result['read_bytes'] >> 20} MiB of floats on the same threads of the same pool, timed "
        "alternately with the kernel so that both see the same load from other processes. Medians. Per CPU-second: "
        "bytes over the CPU time of every thread: the ratio the wall figures reach when no other process competes "
        "for the cores. Best: the repeat with the least CPU time, kernel and read each (the nearest to a quiet "
        "machine where other processes also take caches and memory bandwidth).",
        "",
        "| home | tokens | threads | path | home MiB | ms | GB/s | read GB/s | × read | GB per CPU-s "
        "| read GB per CPU-s | × read per CPU-s | best ms | best × read per CPU-s |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        tokens = f"{row['tokens'] // 1024}K" if row["tokens"] >= 1024 else str(row["tokens"])
        threads = "all" if row["threads"] == 0 else str(row["threads"])
        lines.append(f"| {row['dtype']} | {tokens} | {threads} | {row.get('path', run['path'])} | "
                     f"{row['home_bytes'] / 2**20:.0f} | "
                     f"{row['seconds'] * 1e3:.2f} | {row['gbps']:.2f} | {row['read_gbps']:.2f} | {row['x_read']:.2f} | "
                     f"{row['gb_per_cpu_s']:.2f} | {row['read_gb_per_cpu_s']:.2f} | {row['x_read_cpu']:.2f} | "
                     f"{row['best_ms']:.2f} | {row['x_read_cpu_best']:.2f} |")
    for skip in result["skipped"]:
        lines.append(f"| {skip['dtype']} | {skip['tokens'] // 1024}K | — | — | — | skipped: {skip['why']} | | | | | | | | |")
    cost = result["fixed_cost"]
    lines += ["", "Fixed cost of a call (16 tokens per group, 8 groups; µs, median / min):", ""]
    lines += [f"- {name.replace('_', ' ')}: {v['median_us']:.0f} / {v['min_us']:.0f}" for name, v in cost.items()]
    lines += ["", "Each call follows a read of the whole read buffer, which evicts the layer from the caches: every "
              "call reads its home from DRAM, as a decode step does (the other layers' KV and the weights pass "
              "through the caches between two calls of one layer).", ""]
    lines += [f"Targets: ≥ {result['target_x_read']} × the read at ≥ 32K tokens (1 thread and every core); "
              f"≤ {result['target_1k_ms']} ms for a 1K-token layer call; ≤ 50 µs fixed cost.", ""]
    path = out / "host-attention-cpu.md"
    path.write_text("\n".join(lines))
    return path


def gpu_step(args, store, out: Path, seconds: float) -> None:
    """``benchmarks.gpu.gpu_all``'s ``host-attention`` step: the kernel's ratio to the read on this machine's cores,
    then decode with three splits."""
    started = time.monotonic()
    read_bytes = 1 << 30 if args.scale >= 1 else 64 << 20  # the CPU smoke run (a tiny scale) keeps CI fast
    read = Read(read_bytes)
    for tokens in (1 << 15, 1 << 17):
        for num_threads in (1, 0):
            row = layer_row(max(1024, int(tokens * args.scale)), "bf16", num_threads, read, repeats=3)
            store.append("host-attention", "kernel", context=row["tokens"], **row)
    store.append("host-attention", "read", read_gbps=row["read_gbps"], read_bytes=read_bytes,
                 threads=usable_cores())
    run_step(args, GPU_DECODE_ARGS, store, out, max(10.0, seconds - (time.monotonic() - started)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu.host_attention", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="1K,8K,32K,128K,512K", help="tokens per head group")
    parser.add_argument("--dtypes", default="bf16,int8", help="home dtypes: bf16, int8")
    parser.add_argument("--threads", default="1,all", help="threads per call: numbers, or all (every core)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--read-mib", type=int, default=1024, help="size of the read buffer")
    parser.add_argument("--paths", default="", help="vector paths to time in turns (avx512,avx512bf16); default: "
                        "the one this CPU runs")
    parser.add_argument("--out", default="docs/benchmarks")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if native.kernel() is None:
        parser.error("no C kernel here (no compiler, or HEADINFER_NATIVE=0): nothing to measure")
    threads = [0 if t.strip() == "all" else int(t) for t in args.threads.split(",")]
    paths = [p.strip() for p in args.paths.split(",") if p.strip()] or None
    for path in paths or []:
        if path not in native.PATHS or not native.kernel().variant(native.PATHS[path]):
            parser.error(f"vector path {path!r} is not available here")
    result = run_cpu(parse_tokens(args.tokens), args.dtypes.split(","), threads, args.repeats, args.read_mib << 20,
                     paths)
    print(write_report(result, Path(args.out)).read_text())  # a benchmark script prints its table
    return 0


if __name__ == "__main__":
    sys.exit(main())
