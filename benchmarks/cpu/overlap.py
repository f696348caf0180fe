"""Whether this machine's cores overlap arithmetic with reading memory: the ceiling it puts on a streaming kernel.

Issue 29 item 2 asks the host attention kernel to read its homes at >= 0.7x a plain read. A kernel that does
arithmetic on every vector it reads can only get there where the core computes while its next lines arrive; this
measures whether it does, with no kernel of ours in the way (``overlap.c``, built here with ``-O2 -march=native``):
a stream of floats with K fused multiply-adds per 64-byte vector, timed from L2 (the arithmetic's own pace) and from
DRAM (no software prefetch; prefetches 8 KiB or 64 KiB ahead into L1 or L2; 4 KiB pages or huge pages). Against two
predictions: **overlapped** = min(L2 pace, plain read), **serial** = 1 / (1 / L2 pace + 1 / plain read), the plain
read being the fastest K = 0 stream from DRAM.

    .venv/bin/python -m benchmarks.cpu.overlap   # taskset -c 0 for one core of a busy machine

Writes ``docs/benchmarks/overlap.md`` and ``data/overlap.json``. Needs a C compiler and AVX-512 (x86-64).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from engine.native.library import compiler

from ..records import ResultStore, load_records, machine_line, run_stamp
from ..harness.layout import cited, report_of

SOURCE = Path(__file__).with_name("overlap.c")
OUT = Path("docs/benchmarks/data/overlap.json")


def measure(rounds: int, store: ResultStore) -> None:
    cc = compiler()
    if cc is None:
        raise SystemExit("no C compiler")
    with tempfile.TemporaryDirectory() as folder:
        binary = Path(folder) / "overlap"
        subprocess.run([cc, "-O2", "-march=native", "-o", str(binary), str(SOURCE)], check=True)
        run = subprocess.run([str(binary), str(rounds)], check=True, capture_output=True, text=True, timeout=3600)
    for line in run.stdout.splitlines():
        row = json.loads(line)
        variant = row["source"] if row["source"] == "L2" else \
            f"DRAM {'huge' if row['huge_pages'] else '4K'} pages, " + \
            (f"prefetch {row['prefetch'] // 1024} KiB {row['hint']}" if row["prefetch"] else "no prefetch")
        print(f"K {row['k']}: {variant}: {row['bytes_per_s'] / 1e9:.1f} GB/s", flush=True)
        store.append("stream", f"k{row['k']}", variant=variant, fmas_per_vector=row["k"],
                     bytes_per_s=row["bytes_per_s"])


def write_markdown(records: list[dict], path: Path) -> None:
    rates = {(r["metrics"]["fmas_per_vector"], r["variant"]): r["metrics"]["bytes_per_s"] / 1e9 for r in records
             if r["phase"] == "stream"}
    stamp = records[-1]["run"] if records else {}
    reads = [rate for (k, variant), rate in rates.items() if k == 0 and variant != "L2"]
    read = max(reads) if reads else None
    variants = sorted({v for _, v in rates if v != "L2"}, key=lambda v: ("huge" in v, v))
    lines = ["# Does a core overlap arithmetic with reading memory?", "",
             f"`python -m benchmarks.cpu.overlap` (raw records: `{cited(path, report_of(path))}`). A stream of floats, K fused "
             "multiply-adds per 64-byte vector into 16 independent sums; GB/s of the stream. **L2**: a 256 KiB buffer "
             "read over and over (the arithmetic's pace). **overlapped** = min(L2, plain read) and **serial** = "
             "1 / (1 / L2 + 1 / plain read), the plain read being the fastest K = 0 stream from DRAM. One thread.", "",
             machine_line(stamp), ""]
    if read is None:
        report_of(path).write_text("\n".join(lines) + "\n")
        return
    head = ["K", "L2", "overlapped", "serial", *variants]
    lines += ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for k in sorted({k for k, _ in rates}):
        l2 = rates.get((k, "L2"))
        if l2 is None:
            continue
        cells = [str(k), f"{l2:.1f}", f"{min(l2, read):.1f}", f"{1 / (1 / l2 + 1 / read):.1f}"]
        cells += [f"{rates[(k, v)]:.1f}" if (k, v) in rates else "" for v in variants]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Where a row's DRAM columns sit at **serial**, not **overlapped**, the core computes and waits for "
              "memory in turn: a streaming kernel with that much arithmetic per vector then runs at 1 / (1 / its own "
              "pace + 1 / the read), whatever it prefetches, and only a faster pace of its own (less arithmetic per "
              "byte) brings it nearer the read. Huge pages and software prefetch change which of the two it sits at."]
    report_of(path).write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu.overlap", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    if not args.report_only:
        if args.out.exists():
            args.out.unlink()
        measure(args.rounds, ResultStore(args.out, run_stamp("cpu")))
    write_markdown(load_records(args.out), args.out)


if __name__ == "__main__":
    main()
