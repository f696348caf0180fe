"""Decode GEMVs with the weights prefetched non-temporally (before) vs into every cache level (now), one thread.

``gguf_gemv.c`` (a GGUF file's blocks) and ``int8_gemv.c`` (``weights="int8"`` codes) request the next four rows'
lines while four rows compute. With the non-temporal hint it used, the
loads from DRAM ran at ~6 GB/s on this VM's core against a plain read's ~10; with hint 3 (every level) they run near
the read. Both builds come from the same source (``-DPREFETCH_HINT=0`` for before) and take turns (on a CPU with
AVX-512 VNNI, Q4_K and Q6_K rows take the integer path in both, whose prefetch has its own hint):

1. per shape, weights per second from DRAM (random blocks, ~180 MB of matrices so that no cache holds them);
2. the CPU default model's decode step at 2,048 tokens (cache filled with random K/V), both builds in one process,
   alternating every few steps, so that other tenants' memory traffic falls on both alike.

    taskset -c 0 .venv/bin/python -m benchmarks.cpu.gemv_prefetch

Writes ``docs/benchmarks/gemv-prefetch.md`` and ``data/gemv-prefetch.json``. Figures are medians over rounds.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from engine.cpu import gguf_blocks, int8_matmul
from engine.native import library as native

from ..harness.layout import cited, report_of
from ..records import IN_TURNS, ResultStore, load_records, machine_line, run_stamp
from .turns import decode_in_turns

OUT = Path("docs/benchmarks/data/gemv-prefetch.json")
#: the builds compared: the non-temporal prefetch hint this kernel had, and now
BUILDS = {"before": ["-DPREFETCH_HINT=0"], "now": []}
#: (what, block type, output rows, inputs): the CPU default model's wide and narrow rows, and Llama-3-8B's
#: (what, block type or "int8" for ``int8_gemv.c``'s codes, output rows, inputs)
SHAPES = [("1.5B down (Q4_K)", 12, 1536, 8960), ("1.5B down (Q6_K)", 14, 1536, 8960),
          ("1.5B gate/up (Q4_K)", 12, 8960, 1536), ("8B q/o (Q4_K)", 12, 4096, 4096),
          ("8B down (Q4_K)", 12, 4096, 14336), ("1.5B down (int8 codes)", "int8", 1536, 8960),
          ("1.5B gate/up (int8 codes)", "int8", 8960, 1536), ("8B q/o (int8 codes)", "int8", 4096, 4096)]
MATRIX_BYTES = 180 << 20


def build(name: str) -> dict:
    """``{"gguf": gguf_gemv, "dequantize": gguf_dequantize, "int8": int8_gemv}`` built with one build's flags (cached
    per flags like the engine's own builds; the dequantization serves the embedding's rows in the decode step)."""
    gguf = native.load_library(native.compiler(), gguf_blocks._SOURCE, [[*gguf_blocks._VARIANTS[0], *BUILDS[name]]])
    gguf_gemv, dequantize = gguf_blocks.typed_functions(gguf)[:2]
    int8_gemv = native.load_library(native.compiler(), int8_matmul._SOURCE, [BUILDS[name]]).int8_gemv
    int8_gemv.argtypes, int8_gemv.restype = int8_matmul._ARGTYPES, ctypes.c_int
    return {"gguf": gguf_gemv, "dequantize": dequantize, "int8": int8_gemv}


def shape_rates(kernels: dict, rounds: int, store: ResultStore) -> None:
    for what, qtype, rows, inputs in SHAPES:
        x = torch.randn(1, inputs)  # [1, in]
        y = torch.empty(1, rows)  # [1, out]
        if qtype == "int8":
            copies = max(1, MATRIX_BYTES // (rows * inputs))
            matrices = [torch.randint(-127, 128, (rows, inputs), dtype=torch.int8) for _ in range(copies)]
            scales = torch.rand(rows) * 0.01  # [out]

            def call(gemvs, raw):
                gemvs["int8"](x.data_ptr(), raw.data_ptr(), scales.data_ptr(), None, y.data_ptr(), 1, inputs, rows, 0,
                              rows)
        else:
            _, size, nbytes = gguf_blocks.BLOCK_TYPES[qtype]
            copies = max(1, MATRIX_BYTES // (rows * inputs // size * nbytes))
            rng = np.random.default_rng(0)
            matrices = [gguf_blocks.random_block_rows(rng, qtype, rows, inputs) for _ in range(copies)]  # past every cache

            def call(gemvs, raw):
                gemvs["gguf"](x.data_ptr(), raw.data_ptr(), qtype, None, y.data_ptr(), 1, inputs, rows, 0, rows)
        samples: dict[str, list[float]] = {name: [] for name in kernels}
        for _ in range(rounds):
            for name, gemvs in kernels.items():
                begin = time.perf_counter()
                for raw in matrices:
                    call(gemvs, raw)
                samples[name].append((time.perf_counter() - begin) / copies)
        for name, seconds in samples.items():
            median = statistics.median(seconds)
            print(f"{what}: {name} {rows * inputs / median / 1e9:.2f} G weights/s", flush=True)
            store.append("gemv", name, variant=what, seconds=median, weights_per_s=rows * inputs / median,
                         samples=seconds)


def decode_steps(kernels: dict, context: int, rounds: int, store: ResultStore) -> None:
    engine_kernel = gguf_blocks.kernel

    def use(gemvs: dict):  # block_linear asks at every call
        return lambda: setattr(gguf_blocks, "kernel", lambda: (gemvs["gguf"], gemvs["dequantize"]))

    def restore() -> None:
        gguf_blocks.kernel = engine_kernel

    samples, _, _ = decode_in_turns({name: use(gemvs) for name, gemvs in kernels.items()}, restore, context, rounds)
    for name, seconds in samples.items():
        median = statistics.median(seconds)
        print(f"decode step at {context:,}: {name} {median * 1e3:.0f} ms", flush=True)
        store.append("decode", name, context=context, seconds_per_token=median, samples=seconds)


def write_markdown(records: list[dict], path: Path) -> None:
    gemv = {(r["variant"], r["mode"]): r["metrics"] for r in records if r.get("phase") == "gemv"}
    decode = {(r["context"], r["mode"]): r["metrics"] for r in records if r.get("phase") == "decode"}
    stamp = records[-1]["run"] if records else {}
    lines = ["# Decode GEMVs: the weights' prefetch hint (CPU, one thread)", "",
             f"`taskset -c 0 python -m benchmarks.cpu.gemv_prefetch` (raw records: `{cited(path, report_of(path))}`). Two "
             "builds of `engine/models/gguf_gemv.c` (the AVX-512 path here) and of `engine/models/int8_gemv.c` "
             "(AVX2): **before**, the next rows' lines "
             "requested with the non-temporal hint (`-DPREFETCH_HINT=0`), and **now**, into every cache level "
             "(hint 3). They take turns in each round; each figure is the median over rounds. The sums are the same "
             "operations in the same order: only when the lines arrive differs.", "",
             machine_line(stamp, IN_TURNS), "",
             "| matrix | inputs | before: G weights/s | now: G weights/s | now / before |", "|---|---:|---:|---:|---:|"]
    for what, _, rows, inputs in SHAPES:
        cells = [gemv.get((what, name)) for name in BUILDS]
        if all(cells):
            rates = [c["weights_per_s"] / 1e9 for c in cells]
            lines.append(f"| {what}, {rows:,} rows | {inputs:,} | " + " | ".join(f"{r:.2f}" for r in rates)
                         + f" | {rates[-1] / rates[0]:.2f} |")
    lines += ["", "| CPU default model's decode step | before ms | now ms | now / before |", "|---|---:|---:|---:|"]
    for context in sorted({c for c, _ in decode}):
        cells = [decode.get((context, name)) for name in BUILDS]
        if all(cells):
            ms = [c["seconds_per_token"] * 1e3 for c in cells]
            lines.append(f"| {context:,} tokens | " + " | ".join(f"{m:.0f}" for m in ms) + f" | {ms[-1] / ms[0]:.3f} |")
    lines += ["", *NOTES]
    report_of(path).write_text("\n".join(lines) + "\n")


#: what an experiment of the same session found, which the code no longer carries (kept here with its numbers)
NOTES = [
    "Tried first and dropped: walking rows wider than 2,048 inputs in tiles of 1,024 (4 KB of activations that "
    "stay in L1), 512 rows at a time. Against the non-temporal hint it helped (1.5B down Q4_K 5.9 -> 11.0, Q6_K "
    "3.6 -> 8.2 G weights/s), but with hint 3 rows walked whole were faster on every wide matrix (13.2 vs 11.0, "
    "9.3 vs 8.2, 8B q/o 12.8 vs 12.0, 8B down 13.9 vs 11.4; decode step 178 vs 189 ms, three builds in turns, "
    "2026-11-27). The activations leaving L1 was the prefetch's doing: non-temporal lines go to L1 only, and "
    "evicted ones come again from DRAM.",
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu.gemv_prefetch",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--skip-decode", action="store_true")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    if not args.report_only:
        torch.set_num_threads(1)
        kernels = {name: build(name) for name in BUILDS}
        store = ResultStore(args.out, run_stamp("cpu"))
        shape_rates(kernels, args.rounds, store)
        if not args.skip_decode:
            decode_steps(kernels, args.context, args.rounds * 2, store)
    write_markdown(load_records(args.out), args.out)


if __name__ == "__main__":
    main()
