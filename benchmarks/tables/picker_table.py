"""The picker's table for a stated machine, as Markdown: what each catalogue model reads there, from configs alone.

    python -m benchmarks.tables.picker_table [--gpu-gib 24] [--ram-gib 64] [--disk-gib 1000] [--tflops 100]

Defaults: an RTX 4090 (24 GiB; bf16 prefill at 100 TFLOP/s, about 60% of its dense peak; 900 GB/s of GPU memory)
in a PC with 64 GiB of RAM, 1 TB free for a disk tier and host memory read at 20 GB/s. Budgets are the app's:
the card less the CUDA context and the 1.5 GiB reserve (``engine.planning.budgets.card_budget``), 85% of the RAM. Nothing is measured: these are the planner's numbers, as the app's picker shows
them before any download. Writes docs/benchmarks/picker-4090.md.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

from engine.models.catalogue import Machine, load_catalogue, plan_entry, rank
from engine.planning.budgets import card_budget

GIB = 2**30


def markdown(machine: Machine) -> str:
    fits = rank([plan_entry(e, machine) for e in load_catalogue()])
    lines = ["| model | reads here | RAM only | 8-bit KV | window | read 100K tokens | decode at that length | "
             "bf16 download | license | published score |", "|" + " --- |" * 10]
    for f in fits:
        score = "; ".join(f"{s['name']} {s['value']}" for s in f.entry.scores) or "–"
        reads = f"{f.reads_tokens:,}" if f.reads_tokens else "weights do not fit"
        reads += "" if f.supported else " (not served yet)"
        decode = f"{f.decode_seconds:.2f} s/token" if f.reads_tokens else "–"
        lines.append(f"| {f.entry.id} | {reads} | {f.ram_tokens:,} | {f.int8_tokens:,} | {f.window or 0:,} | "
                     f"{f.read_seconds / 60:.1f} min | {decode} | {f.entry.download_gb} GB | "
                     f"{f.entry.license} | {score} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tables.picker_table")
    p.add_argument("--gpu-gib", type=float, default=24)
    p.add_argument("--ram-gib", type=float, default=64)
    p.add_argument("--disk-gib", type=float, default=1000)
    p.add_argument("--tflops", type=float, default=100)
    p.add_argument("--out", default="docs/benchmarks/picker-4090.md")
    args = p.parse_args(argv)
    machine = Machine(f"{args.gpu_gib:g} GiB GPU, {args.ram_gib:g} GiB RAM", True, card_budget(int(args.gpu_gib * GIB)),
                      int(args.ram_gib * GIB * 0.85), int(args.disk_gib * GIB), args.tflops * 1e12, 20.0, 900.0)
    text = (f"# What each model reads on a {machine.name} machine (planned, not measured)\n\n"
            f"`python -m benchmarks.tables.picker_table` ({datetime.date.today()}): the app's model picker for an RTX 4090 "
            f"({args.gpu_gib:g} GiB) in a PC with {args.ram_gib:g} GiB of RAM and {args.disk_gib:g} GiB free for a "
            f"disk tier; bf16 weights; prefill at {args.tflops:g} TFLOP/s, GPU memory at 900 GB/s, host memory at "
            f"20 GB/s. **Reads here**: the longest document read exactly (KV in RAM, or RAM plus the disk tier), "
            f"capped at the model's trained window. **Decode**: weights from GPU memory plus the whole KV read from "
            f"RAM once per token, at the 'reads here' length. Caveats per model are in `engine/models/catalogue.json`.\n\n"
            + markdown(machine) + "\n")
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
