"""The host attention kernel's prefetch hint for bf16/fp16/fp32 homes: the next tokens' lines requested into L1
(before: T0) vs into L2 and below only (now: ``__builtin_prefetch`` locality 1, prefetcht2), on one thread and on
every core. int8 homes keep T0 (``HA_PREFETCH_HINT_INT8``: prefetcht2 measured 3-9% slower for them), so their rows
run the same code in both builds: the control that shows how far two turns of one kernel differ.

``host_kernel.c`` requests a head's keys (values) 8 KiB ahead as it scores (adds) each token. A request into L1
holds one of the core's few line-fill buffers until the line arrives; the kernel's own loads wait for those same
buffers, so a stream of L1 requests caps how many lines are in flight (int8 homes read at ~half a plain read's
speed with arithmetic that, from cache, takes half the time). Requests into L2 queue in L2's larger miss queue
instead, and the line moves to L1 on the demand load, a few cycles later (for int8 that cost more than it saved).
Both builds come from the same source (``-DHA_PREFETCH_HINT=3`` for before) and take turns, each call after a 1 GiB
read so that its layer comes from DRAM as a decode step's does:

    .venv/bin/python -m benchmarks.harness.host_prefetch

Writes ``docs/benchmarks/host-prefetch.json`` and ``.md``. Figures are medians over rounds; the read is timed in
the same rounds. The results are the same operations in the same order: only when the lines arrive differs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from engine.kv import native
from engine.native.library import compiler

from ..records import IN_TURNS, ResultStore, load_records, machine_line, run_stamp
from .host_attention import LLAMA3_8B, Layer, Read

OUT = Path("docs/benchmarks/host-prefetch.json")
#: the builds compared: the hint this kernel had (T0, into L1), and now (the source's default)
BUILDS = {"before": ["-DHA_PREFETCH_HINT=3"], "now": []}
#: (home dtype, tokens per group) of a Llama-3-8B layer: 8 groups of one KV head, 4 query rows each
CASES = [("bf16", 32768), ("bf16", 131072), ("int8", 32768), ("int8", 131072)]


def measure(kernels: dict, cases: list, threads: list[int], rounds: int, store: ResultStore) -> None:
    read = Read(1 << 30)
    for dtype, tokens in cases:
        layer = Layer(tokens, dtype, **LLAMA3_8B)
        for num_threads in threads:
            for function in kernels.values():  # warm: the pool started, pages touched
                layer.call(num_threads, function)
            samples: dict[str, list[float]] = {name: [] for name in kernels}
            reads = []
            for round_index in range(rounds):
                order = list(kernels.items())  # in turns, which goes first alternating (ABBA): no order bias
                for name, function in order if round_index % 2 == 0 else order[::-1]:
                    read.call(num_threads)  # the layer leaves the caches
                    begin = time.perf_counter()
                    layer.call(num_threads, function)
                    samples[name].append(time.perf_counter() - begin)
                begin = time.perf_counter()
                read.call(num_threads)
                reads.append(time.perf_counter() - begin)
            read_gbps = read.data.nbytes / statistics.median(reads) / 1e9
            for name, seconds in samples.items():
                median = statistics.median(seconds)
                gbps = layer.home_bytes / median / 1e9
                print(f"{dtype} {tokens:,} x{num_threads or 'all'}: {name} {median * 1e3:.2f} ms, {gbps:.2f} GB/s, "
                      f"{gbps / read_gbps:.2f} x the read", flush=True)
                store.append("layer", name, context=tokens, variant=f"{dtype}/{num_threads}", seconds=median,
                             gbps=gbps, read_gbps=read_gbps, samples=seconds)


def write_markdown(records: list[dict], path: Path) -> None:
    rows = {(r["variant"], r["context"], r["mode"]): r["metrics"] for r in records if r.get("phase") == "layer"}
    stamp = records[-1]["run"] if records else {}
    lines = ["# Host attention: the prefetch hint (CPU)", "",
             "`python -m benchmarks.harness.host_prefetch` (raw records: `host-prefetch.json`). Two builds of "
             "`engine/kv/host_kernel.c` from the same source: **before**, the next tokens' lines requested into L1 "
             "(`-DHA_PREFETCH_HINT=3`, prefetcht0), and **now**, into L2 and below (locality 1, prefetcht2), for bf16 "
             "homes; int8 homes keep prefetcht0 in both (`HA_PREFETCH_HINT_INT8`), so their rows are the same code "
             "twice: the noise of two turns. One "
             "Llama-3-8B layer call (8 groups of one KV head, 4 query rows each, head dim 128), each after a 1 GiB "
             "read; the builds take turns in every round (which goes first alternates) and the read is timed in the "
             "same rounds. Medians.", "",
             machine_line(stamp, IN_TURNS), "",
             "| home | tokens | threads | before ms | now ms | now / before | before x read | now x read |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for variant, context in sorted({(v, c) for v, c, _ in rows}, key=lambda k: (k[0].split("/")[0], k[1], k[0])):
        cells = [rows.get((variant, context, name)) for name in BUILDS]
        if not all(cells):
            continue
        dtype, threads = variant.split("/")
        ms = [c["seconds"] * 1e3 for c in cells]
        ratios = [c["gbps"] / c["read_gbps"] for c in cells]
        lines.append(f"| {dtype} | {context:,} | {'every core' if threads == '0' else threads} | {ms[0]:.2f} | "
                     f"{ms[1]:.2f} | {ms[1] / ms[0]:.3f} | {ratios[0]:.2f} | {ratios[1]:.2f} |")
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.harness.host_prefetch",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", default="1,0", help="threads per call, comma-separated (0: every core)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    if not args.report_only:
        kernels = {name: native.build(compiler(), flags) for name, flags in BUILDS.items()}
        store = ResultStore(args.out, run_stamp("cpu"))
        measure(kernels, CASES, [int(t) for t in args.threads.split(",")], args.rounds, store)
    write_markdown(load_records(args.out), args.out)


if __name__ == "__main__":
    main()
