"""From which block size a CPU decode step's attention runs on the kernel's pool (``kernels.POOL_BYTES``), on two
threads: the CPU default model's decode step with each threshold, in turns in one process.

The C kernel attends a layer's token-major block on this thread, or split over the pool's threads where the block
is at least ``POOL_BYTES``. Waking the pool costs ~13 us a call (``host-attention-cpu-quiet.md``: 61 vs 48); the
other core reads half the block meanwhile. The CPU default model's layer holds 2 KV heads of 128 in fp32: 2 KiB a
token, so a 2K-token context is a 4 MiB block, below the 8 MiB the threshold was first set at.

    python -m benchmarks.cpu.pool_bytes --contexts 1024,2048,4096 --thresholds 8192,3072

Writes ``docs/benchmarks/pool-bytes.md`` and ``data/pool-bytes.json``: per context, the step's median ms under each threshold
(KiB), rounds alternating so that other tenants' memory traffic falls on both alike.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from engine.kv import kernels

from ..records import ResultStore, load_records, machine_line, run_stamp
from ..harness.layout import cited, report_of
from .turns import decode_in_turns

OUT = Path("docs/benchmarks/data/pool-bytes.json")


def decode_steps(context: int, thresholds: list[int], rounds: int, store: ResultStore, threads: int) -> None:
    engine_value = kernels.POOL_BYTES

    def use(kib: int):  # _cpu_tile reads it at every call
        return lambda: setattr(kernels, "POOL_BYTES", kib << 10)

    def restore() -> None:
        kernels.POOL_BYTES = engine_value

    by_name, shape, dtype = decode_in_turns({str(kib): use(kib) for kib in thresholds}, restore, context, rounds, per_round=4)
    samples = {int(name): seconds for name, seconds in by_name.items()}
    block = context * shape.num_kv_heads * shape.head_dim * 2 * dtype.itemsize  # one layer's K and V
    for kib, seconds in samples.items():
        median = statistics.median(seconds)
        print(f"decode step at {context:,} ({block / 2**20:.1f} MiB a layer), POOL_BYTES {kib} KiB: "
              f"{median * 1e3:.1f} ms", flush=True)
        store.append("decode", f"{kib} KiB", context=context, threshold_kib=kib, block_bytes=block, threads=threads,
                     seconds_per_token=median, samples=seconds)


def write_markdown(records: list[dict], path: Path) -> None:
    decode = [r for r in records if r.get("phase") == "decode"]
    thresholds = sorted({r["metrics"]["threshold_kib"] for r in decode}, reverse=True)
    stamp = decode[-1]["run"] if decode else {}
    lines = ["# CPU decode attention: from which block size it runs on the kernel's pool (two threads)", "",
             f"`python -m benchmarks.cpu.pool_bytes` (raw records: `{cited(path, report_of(path))}`). The CPU default model "
             "(Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M, fp32 KV: 2 KiB a token a layer), its decode step after a "
             "cache filled with random K/V, with `kernels.POOL_BYTES` at each threshold in turns, in one process. "
             "A layer's block at or above the threshold is attended by the pool's threads, below it on one. "
             "Medians of every step of every round.", "",
             machine_line(stamp), "",
             "| context | block a layer MiB | " + " | ".join(f"POOL_BYTES {k:,} KiB: ms" for k in thresholds)
             + " | last / first |", "|---:|---:|" + "---:|" * len(thresholds) + "---:|"]
    for context in sorted({r["context"] for r in decode}):
        cells = {r["metrics"]["threshold_kib"]: r["metrics"] for r in decode if r["context"] == context}
        if all(k in cells for k in thresholds):
            ms = [cells[k]["seconds_per_token"] * 1e3 for k in thresholds]
            block = cells[thresholds[0]]["block_bytes"] / 2**20
            lines.append(f"| {context:,} | {block:.1f} | " + " | ".join(f"{m:.1f}" for m in ms)
                         + f" | {ms[-1] / ms[0]:.3f} |")
    report_of(path).write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu.pool_bytes", description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="1024,2048,4096")
    parser.add_argument("--thresholds", default="8192,3072", help="POOL_BYTES values to compare, KiB")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    if not args.report_only:
        torch.set_num_threads(args.threads)
        store = ResultStore(args.out, run_stamp("cpu"))
        for context in (int(c) for c in args.contexts.split(",")):
            decode_steps(context, [int(k) for k in args.thresholds.split(",")], args.rounds, store, args.threads)
    write_markdown(load_records(args.out), args.out)


if __name__ == "__main__":
    main()
