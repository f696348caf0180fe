"""Ours vs llama.cpp on the CPU, on the same GGUF file: decode tok/s at 2K and 8K tokens of context, prefill tok/s
and peak RSS, for our fp32, bf16, int8 and gguf weights (``load_model(dtype=..., weights=...)``; gguf keeps the
file's own Q4_1/Q8_0 blocks).

Every measurement is a fresh process (peak RSS is the process's, from ``wait4``), at one thread; within each round
and context the runs alternate ours and theirs (the first mode, llama.cpp, the second, llama.cpp-prefill, the rest). Ours: the GGUF
loaded through ``load_model`` (converted once into the cache, as the app does), the context read in 512-token
chunks through ``HeadInferCache`` (past 2,048 tokens filled with random K/V instead), then greedy decode; theirs: ``llama-bench`` (decode: ``-p 0 -n N -d C``, which
reads C tokens first; prefill: ``-p C -n 0``). Build llama.cpp as docs/benchmarks/llamacpp.md says, then

    .venv/bin/python -m benchmarks.weights.llamacpp_compare --llama-bench /tmp/llama.cpp-build/bin/llama-bench
    .venv/bin/python -m benchmarks.weights.llamacpp_compare --report-only     # rewrite the .md from the .json

Without ``--llama-bench`` only our rows are measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..harness.layout import cited, report_of

OUT = Path("docs/benchmarks/data/llamacpp.json")
MODES = {"fp32": ("float32", "dense"), "bf16": ("bfloat16", "dense"), "int8": ("auto", "int8"),
         "gguf": ("auto", "gguf")}
CHUNK = 512
QUALITY_TOKENS = 1024
PREFILL_MAX = 2048  # longer contexts are filled with random K/V, not read (on 2 shared cores an 8K read takes minutes)
BUILD_STEPS = """\
    # llama.cpp from the sources vendored in the llama-cpp-python sdist (PyPI), CPU only, in /tmp (-j2: shared cores)
    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/llama
    tar xzf /tmp/llama/llama_cpp_python-0.3.36.tar.gz -C /tmp/llama
    cmake -S /tmp/llama/llama_cpp_python-0.3.36/vendor/llama.cpp -B /tmp/llama.cpp-build -DCMAKE_BUILD_TYPE=Release \\
          -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \\
          -DLLAMA_BUILD_SERVER=OFF
    cmake --build /tmp/llama.cpp-build -j2 --target llama-bench      # about an hour on 2 busy cores
    .venv/bin/python -m benchmarks.weights.llamacpp_compare --llama-bench /tmp/llama.cpp-build/bin/llama-bench"""
TEXT_MODULES = ("argparse", "logging/__init__", "textwrap", "json/decoder", "unittest/case", "collections/__init__",
                "pathlib", "subprocess", "typing", "email/message", "http/client", "tarfile")


def measure_child(mode: str, context: int, decode_tokens: int, gguf: Path, threads: int, quality: bool) -> dict:
    """Runs in the child process: load, read ``context`` tokens, decode; or (``quality``) the text's perplexity."""
    import torch

    import engine
    from engine.cpu.fused_decode import FusedDecode
    from engine.models.loader import load_model
    from engine.types import ModelShape

    from ..harness.fill import fill_random

    torch.set_num_threads(threads)
    dtype, weights = MODES[mode]
    start = time.perf_counter()
    model, tokenizer = load_model(str(gguf), device="cpu", dtype=dtype, weights=weights)
    load_s = time.perf_counter() - start
    ids = torch.tensor([_text_ids(tokenizer, context)])
    kv_dtype = next(model.parameters()).dtype
    cache = engine.HeadInferCache(model.config, device="cpu", dtype=kv_dtype, max_context=context + decode_tokens + 1,
                                  chunk_size=CHUNK)
    with torch.inference_mode():
        if quality:
            return {"load_s": load_s, **_perplexity(model, ids, cache)}
        if context > PREFILL_MAX:  # the cache filled with random K/V: decode costs the same, in a fraction of the time
            shape = ModelShape.from_config(model.config)
            fill = lambda: fill_random(cache, context, head_dim=shape.head_dim, num_kv_heads=shape.num_kv_heads,
                                       device=torch.device("cpu"), dtype=kv_dtype)
        else:
            fill = None
        fused = FusedDecode.for_model(model)  # what a session decodes with, where the model takes it
        prefill_s, steps = read_then_decode(model, cache, ids, context, decode_tokens, fill,
                                            None if fused is None else fused.step)
    return {"load_s": load_s, "prefill_s": prefill_s, "decode_steps_s": steps, "end_rss": _own_rss(),
            "fused": fused is not None}



def read_then_decode(model, cache, ids, context: int, decode_tokens: int, fill,
                     step=None) -> tuple[float | None, list[float]]:
    """(seconds to read ``ids`` in ``CHUNK``-token forwards or None where ``fill()`` filled the cache instead, the
    greedy decode steps' seconds): the timed part every side of these comparisons shares. ``ids``: [1, context].
    ``step(token, cache)``: a decode step giving the next logits [vocab] (ours: the session's fused step where the
    model takes it); None: the model's forward."""
    import torch

    prefill_s = None
    with torch.inference_mode():
        if fill is not None:
            fill()
            token = ids[:, -1:]
        else:
            start = time.perf_counter()
            for begin in range(0, context, CHUNK):
                logits = model(ids[:, begin : begin + CHUNK], past_key_values=cache, use_cache=True,
                               logits_to_keep=1).logits
            prefill_s = time.perf_counter() - start
            token = logits[:, -1].argmax(-1, keepdim=True)
        steps = []
        for _ in range(decode_tokens):
            start = time.perf_counter()
            if step is None:
                logits = model(token, past_key_values=cache, use_cache=True).logits[:, -1]  # [1, vocab]
            else:
                logits = step(int(token), cache)[None]
            token = logits.argmax(-1, keepdim=True)  # [1, 1]
            steps.append(time.perf_counter() - start)
    return prefill_s, steps

def _own_rss() -> int:
    """This process's resident set now (after loading, reading and decoding): what it holds, not its peak."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def profile_child(mode: str, context: int, threads: int, gguf: Path, steps: int = 8) -> dict:
    """Runs in the child process: torch.profiler over ``steps`` decode steps after ``context`` random K/V; the share
    of self CPU time per op, and SDPA decode over a token-major home vs the same K/V contiguous (the home layout)."""
    import torch
    import torch.nn.functional as F

    import engine
    from engine.models.loader import load_model
    from engine.types import ModelShape

    from ..harness.fill import fill_random

    torch.set_num_threads(threads)
    dtype, weights = MODES[mode]
    model, _ = load_model(str(gguf), device="cpu", dtype=dtype, weights=weights, with_tokenizer=False)
    kv_dtype = next(model.parameters()).dtype
    shape = ModelShape.from_config(model.config)
    cache = engine.HeadInferCache(model.config, device="cpu", dtype=kv_dtype, max_context=context + 2 * steps + 4)
    fill_random(cache, context, head_dim=shape.head_dim, num_kv_heads=shape.num_kv_heads,
                device=torch.device("cpu"), dtype=kv_dtype)
    token = torch.tensor([[42]])
    with torch.inference_mode():
        for _ in range(3):
            model(token, past_key_values=cache, use_cache=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
            for _ in range(steps):
                model(token, past_key_values=cache, use_cache=True)
    events = profiler.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    ops = sorted(((e.key, e.self_cpu_time_total / total, e.count / steps) for e in events), key=lambda x: -x[1])
    # The same decode attention over one layer's K/V: token-major home [K, B, 2, Hk, D] (what the cache attends)
    # against [B, Hk, K, D] contiguous copies; one query per query head, GQA folded as kernels.py does.
    home = torch.randn(context, 1, 2, shape.num_kv_heads, shape.head_dim).to(kv_dtype)
    keys, values = home.permute(2, 1, 3, 0, 4).unbind(0)
    contiguous = keys.contiguous(), values.contiguous()
    query = torch.randn(1, shape.num_kv_heads, shape.num_heads // shape.num_kv_heads, shape.head_dim).to(kv_dtype)
    layout = {name: _median_ms(lambda: F.scaled_dot_product_attention(query, *kv)) for name, kv in
              (("token_major_ms", (keys, values)), ("contiguous_ms", contiguous))}
    return {"ops": [{"op": k, "share": share, "calls_per_step": calls} for k, share, calls in ops[:12]],
            "step_ms": total / 1000 / steps, "attention_layer": layout}


def _median_ms(fn, repeats: int = 30) -> float:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def _perplexity(model, ids, cache) -> dict:
    """Mean negative log-likelihood of each next token of the text, read in chunks."""
    import torch

    total, count = 0.0, 0
    for begin in range(0, ids.shape[1] - 1, 256):
        chunk = ids[:, begin : begin + 256]
        logits = model(chunk, past_key_values=cache, use_cache=True).logits.float()
        targets = ids[:, begin + 1 : begin + 1 + chunk.shape[1]]
        logits = logits[:, : targets.shape[1]]
        total += float(torch.nn.functional.cross_entropy(logits[0], targets[0], reduction="sum"))
        count += targets.shape[1]
    return {"nll": total / count, "perplexity": math.exp(total / count), "tokens": count}


def _text_ids(tokenizer, length: int) -> list[int]:
    """``length`` token ids of real text: Python standard-library sources, repeated if needed."""
    folder = Path(os.__file__).parent
    text = "\n\n".join((folder / f"{name}.py").read_text(encoding="utf-8") for name in TEXT_MODULES)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return (ids * (length // len(ids) + 1))[:length]


def run_ours(mode: str, context: int, decode_tokens: int, gguf: Path, threads: int, quality: bool = False) -> dict:
    """One measurement in a fresh process; adds its peak RSS."""
    command = [sys.executable, "-m", "benchmarks.weights.llamacpp_compare", "--child", mode, "--contexts", str(context),
               "--decode-tokens", str(decode_tokens), "--gguf", str(gguf), "--threads", str(threads)]
    result, peak = _run(command + (["--quality"] if quality else []))
    return json.loads(result.strip().splitlines()[-1]) | {"peak_rss": peak}


def run_theirs(binary: Path, gguf: Path, context: int, decode_tokens: int, threads: int, phase: str) -> dict:
    """llama-bench, one test: ``decode`` (N tokens after reading C) or ``prefill`` (C tokens); t/s and peak RSS."""
    tokens = ["-p", "0", "-n", str(decode_tokens), "-d", str(context)] if phase == "decode" else \
        ["-p", str(context), "-n", "0"]
    out, peak = _run([str(binary), "-m", str(gguf), "-t", str(threads), "-r", "1", "-o", "json", *tokens])
    test = json.loads(out)[0]
    return {"tokens_per_s": test["avg_ts"], "peak_rss": peak, "build": test.get("build_commit"),
            "cpu": test.get("cpu_info"), "type": test.get("model_type")}


def _run(command: list[str], threads: int = 1, environ: dict | None = None) -> tuple[str, int]:
    """stdout and peak RSS (bytes) of a child process on ``threads`` OpenMP threads: its ``VmHWM``, polled every 20 ms until it exits.

    Not ``wait4``'s ``ru_maxrss``: Linux carries the forking parent's high-water mark into the child's at exec, so
    every child would report at least this (torch-importing) process's RSS.
    """
    env = (environ or os.environ) | {"OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, text=True, env=env)
        peak = 0
        while process.poll() is None:
            peak = max(peak, _high_water(process.pid))
            time.sleep(0.02)
        out.seek(0)
        err.seek(0)
        if process.returncode:
            raise RuntimeError(f"{command[0]} failed ({process.returncode}): {err.read()[-2000:]}")
        return out.read(), peak


def _high_water(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):  # exited between poll() and the read
        pass
    return 0


def bare_rss() -> dict:
    """Peak RSS of a process that only imports: the floor any in-process torch engine starts from."""
    floors = {}
    for name, code in (("python", "pass"), ("import torch", "import torch"),
                       ("import torch, transformers, engine", "import torch, transformers, engine")):
        floors[name] = _run([sys.executable, "-c", code])[1]
    return floors


_FLOOR_CHILD = """
import sys
import numpy as np
import torch
import transformers
getattr(transformers, sys.argv[2])  # the model class: what any engine running transformers' model imports
layers, heads, dim, tokens = map(int, sys.argv[3:7])
weights = np.memmap(sys.argv[1], dtype=np.uint8, mode="r")
int(weights[::4096].sum())  # every page of the file read, as a forward reads every weight
torch.empty(layers, tokens, 2, heads, dim).fill_(0.0)  # float32 K/V: what equals stock's fp32 model, written
"""


def floor_rss(gguf: Path, contexts: list[int], decode_tokens: int) -> dict:
    """The peak RSS no exact engine inside torch + transformers can go below, per context: a process that imports
    them and the model's class, reads every byte of the GGUF (the blocks a forward reads) and writes float32 K/V
    for the context (stock transformers' K/V for fp32 weights). Nothing else: no tokenizer, no activations."""
    from engine.models.loader import converted_gguf_dir, read_config
    from engine.types import ModelShape

    config = read_config(str(converted_gguf_dir(gguf)))  # the folder's config names the class
    shape = ModelShape.from_config(config)
    return {str(context): _run([sys.executable, "-c", _FLOOR_CHILD, str(gguf), config.architectures[0],
                                str(shape.num_layers), str(shape.num_kv_heads), str(shape.head_dim),
                                str(context + decode_tokens + 1)])[1]
            for context in contexts}


def measure(args) -> dict:
    """The interleaved rounds; returns the raw record written to the .json."""
    record = {"stamp": _stamp(), "gguf": str(args.gguf), "gguf_bytes": args.gguf.stat().st_size,
              "threads": args.threads, "decode_tokens": args.decode_tokens, "runs": [], "bare_rss": bare_rss()}
    # The first load converts the GGUF into the cache (minutes, once): done before anything is timed.
    run_ours("fp32", 64, 2, args.gguf, args.threads)
    for mode in args.modes:
        record.setdefault("quality", {})[mode] = run_ours(mode, QUALITY_TOKENS, 0, args.gguf, args.threads,
                                                          quality=True)
        print(f"quality {mode}: perplexity {record['quality'][mode]['perplexity']:.3f}", flush=True)
    for round_index in range(args.rounds):
        for context in args.contexts:
            order = [("ours", m) for m in args.modes]
            if args.llama_bench:  # theirs between ours: decode after the first mode, prefill after the second
                order.insert(1, ("theirs", "decode"))
                if context <= PREFILL_MAX:
                    order.insert(3, ("theirs", "prefill"))
            for side, what in order:
                if side == "ours":
                    result = run_ours(what, context, args.decode_tokens, args.gguf, args.threads)
                    summary = f"decode {1 / statistics.median(result['decode_steps_s']):.1f} tok/s" + (
                        f", prefill {context / result['prefill_s']:.0f} tok/s" if result["prefill_s"] else "")
                else:
                    result = run_theirs(args.llama_bench, args.gguf, context, args.decode_tokens, args.threads, what)
                    summary = f"{what} {result['tokens_per_s']:.1f} tok/s"
                record["runs"].append({"round": round_index, "context": context, "side": side, "what": what,
                                       **result})
                print(f"round {round_index} {context} {side} {what}: {summary}, "
                      f"peak {result['peak_rss'] / 2**20:.0f} MiB", flush=True)
    return record


def _stamp() -> dict:
    from ..records import run_stamp

    return run_stamp("cpu")


def summarize(record: dict) -> dict:
    """Per context: medians over rounds of decode tok/s, prefill tok/s and peak RSS, ours per mode and theirs."""
    table: dict = {}
    for run in record["runs"]:
        row = table.setdefault(str(run["context"]), {})
        if run["side"] == "ours":
            entry = row.setdefault(run["what"], {"decode": [], "prefill": [], "rss": [], "held": []})
            entry["decode"].append(1 / statistics.median(run["decode_steps_s"]))
            entry["held"].append(run["end_rss"])
            if run["prefill_s"]:
                entry["prefill"].append(run["context"] / run["prefill_s"])
            entry["rss"].append(run["peak_rss"])
        else:
            entry = row.setdefault("llama.cpp", {"decode": [], "prefill": [], "rss": []})
            entry[run["what"]].append(run["tokens_per_s"])
            if run["what"] == "decode":
                entry["rss"].append(run["peak_rss"])
    return {context: {side: {k: statistics.median(v) for k, v in values.items() if v} for side, values in row.items()}
            for context, row in table.items()}


def per_round_ratios(record: dict, context: int) -> dict[str, list[float]]:
    """mode -> decode tok/s ours / llama.cpp's, round by round (each pair measured minutes apart)."""
    theirs = {r["round"]: r["tokens_per_s"] for r in record["runs"]
              if r["side"] == "theirs" and r["what"] == "decode" and r["context"] == context}
    ratios: dict[str, list[float]] = {}
    for run in record["runs"]:
        if run["side"] == "ours" and run["context"] == context and run["round"] in theirs:
            ours = 1 / statistics.median(run["decode_steps_s"])
            ratios.setdefault(run["what"], []).append(ours / theirs[run["round"]])
    return ratios


def write_markdown(record: dict, path: Path) -> None:
    summary = summarize(record)
    stamp = record["stamp"]
    modes = [m for m in MODES if any(m in row for row in summary.values())]
    theirs = any("llama.cpp" in row for row in summary.values())
    lines = [
        "# CPU: ours vs llama.cpp on the same GGUF",
        "",
        f"`python -m benchmarks.weights.llamacpp_compare` (raw runs: `{cited(path, report_of(path))}`). File: "
        f"`{Path(record['gguf']).name}` ({record['gguf_bytes'] / 2**20:.0f} MiB), {record['threads']} thread, "
        f"{record['decode_tokens']} decode tokens per run; every figure the median over rounds of a fresh process, "
        "ours and llama.cpp taking turns. Ours: the GGUF through `load_model` (converted once and cached), the "
        f"context read in {CHUNK}-token chunks through `HeadInferCache` (past {PREFILL_MAX:,} tokens the cache is "
        "filled with random K/V instead: decode costs the same, and on these 2 shared cores an 8K read takes minutes), "
        "greedy decode (tok/s = 1 / median step). "
        "Theirs: `llama-bench -t 1 -r 1` (`-p 0 -n N -d C` for decode after C tokens, `-p C -n 0` for prefill).",
        "",
        f"Machine: {stamp.get('machine', '?')}; torch {stamp.get('torch', '?')}; load average at the start "
        f"{stamp.get('load_avg', '?')} (a shared machine: other work makes every figure noisy)."
        + (f" llama.cpp build {_their(record, 'build')}, {_their(record, 'type')}, CPU {_their(record, 'cpu')}."
           if theirs else " llama.cpp: not measured in this run (no --llama-bench)."),
        "",
    ]
    for key, title, unit, target in (("decode", "Decode", "tok/s", {"2048": 0.8, "8192": 1.0}),
                                     ("prefill", "Prefill (reading C tokens)", "tok/s", {}),
                                     ("rss", "Peak RSS", "MiB", {})):
        lines += [f"## {title}", "", "| context | llama.cpp | " + " | ".join(f"ours {m} (x llama.cpp)" for m in modes)
                  + (" | target |" if key != "prefill" else " | target |"), "|---:|---:|" + "---:|" * len(modes) + "---|"]
        for context in sorted(summary, key=int):
            row = summary[context]
            if not any(key in entry for entry in row.values()):
                continue  # e.g. no prefill at a context that was filled, not read
            base = row.get("llama.cpp", {}).get(key)
            cells = [_fmt(base, key)]
            for mode in modes:
                value = row.get(mode, {}).get(key)
                ratio = f" ({value / base:.2f}x)" if value and base else ""
                cells.append(_fmt(value, key) + ratio)
            goal = {"decode": f">= {target.get(context, '?')}x", "prefill": "> 1x", "rss": "<= 2x"}[key]
            lines.append(f"| {int(context):,} | " + " | ".join(cells) + f" | {goal} |")
        if key == "decode":
            lines += ["", "Per round (ours / llama.cpp in the same round, the pairs that ran minutes apart): " + "; ".join(
                f"{int(c):,}: " + ", ".join(f"{m} " + " / ".join(f"{r:.2f}" for r in ratios)
                                            for m, ratios in per_round_ratios(record, int(c)).items())
                for c in sorted(summary, key=int)) + "."]
        if key == "rss" and record.get("floor"):
            floor = record["floor"]
            lines += ["", "The floor of an exact engine in torch + transformers (`--floor`, measured "
                      f"{floor['stamp'].get('date', '?')[:10]}): a process that imports them and the model's class, "
                      "reads every byte of the GGUF and writes float32 K/V for the context, nothing else: " + "; ".join(
                          f"{int(c):,} tokens {v / 2**20:,.0f} MiB"
                          + (f" ({v / summary[c]['llama.cpp']['rss']:.2f}x llama.cpp)"
                             if summary.get(c, {}).get("llama.cpp", {}).get("rss") else "")
                          for c, v in floor["contexts"].items()) + "."]
        if key == "rss":
            lines += ["", "What our process still holds after decoding (VmRSS at its end; where it is below the peak "
                      "above, the peak was reached while loading): " + "; ".join(
                          f"{int(c):,} tokens: " + ", ".join(f"{m} {summary[c][m]['held'] / 2**20:,.0f} MiB"
                                                             for m in modes if "held" in summary[c].get(m, {}))
                          for c in sorted(summary, key=int)) + "."]
        lines.append("")
    floors = record["bare_rss"]
    lines += ["Peak RSS of processes that only import: " + ", ".join(f"`{k}` {v / 2**20:.0f} MiB"
                                                                     for k, v in floors.items()) + ".", ""]
    if record.get("quality"):
        lines += [f"## Accuracy: perplexity of the text the contexts are read from ({QUALITY_TOKENS:,} tokens)", "",
                  "| weights | perplexity | mean NLL |", "|---|---:|---:|"]
        lines += [f"| {m} | {q['perplexity']:.3f} | {q['nll']:.4f} |" for m, q in record["quality"].items()]
        lines.append("")
    lines += _targets(summary, modes, record) + _profile_lines(record.get("profile", {}))
    lines += ["## Building the baseline", "", BUILD_STEPS, ""]
    report_of(path).write_text("\n".join(lines + record.get("notes", [])) + "\n")


def _targets(summary: dict, modes: list[str], record: dict) -> list[str]:
    """Each target of issue 20 item 6 against the best of our modes, met or not, with the figures; a decode target
    whose rounds fall on both sides of it is "not shown", whatever the median says."""
    lines = ["## Targets (issue 20 item 6), best of our modes", ""]
    checks = (("decode", "2048", 0.8, max), ("decode", "8192", 1.0, max), ("prefill", "2048", 1.0, max),
              ("rss", "2048", 2.0, min), ("rss", "8192", 2.0, min))
    for key, context, goal, best in checks:
        row = summary.get(context, {})
        base = row.get("llama.cpp", {}).get(key)
        ratios = {m: row[m][key] / base for m in modes if base and key in row.get(m, {})}
        if not ratios:
            continue
        mode = best(ratios, key=ratios.get)
        met = ratios[mode] >= goal if key != "rss" else ratios[mode] <= goal
        verdict = "met" if met else "not met"
        rounds = per_round_ratios(record, int(context)).get(mode, []) if key == "decode" else []
        if met and min(rounds, default=goal) < goal:
            verdict = "not shown (rounds: " + " / ".join(f"{r:.2f}x" for r in rounds) + ")"
        relation = ">=" if key != "rss" else "<="
        floor = record.get("floor", {}).get("contexts", {}).get(context) if key == "rss" else None
        below = f" (the floor of an exact in-torch engine: {floor / base:.2f}x)" if floor else ""
        lines.append(f"- {key} at {int(context):,}: {ratios[mode]:.2f}x llama.cpp ({mode}); target {relation} {goal}x: "
                     f"**{verdict}**{below}")
    return lines + [""]


def _profile_lines(profile: dict) -> list[str]:
    if not profile:
        return []
    lines = ["## Where our decode time goes (`--profile`: torch.profiler, self CPU time per op)", ""]
    for name, entry in profile.items():
        ops = ", ".join(f"`{o['op'].removeprefix('aten::')}` {o['share']:.0%} ({o['calls_per_step']:.0f}/step)"
                        for o in entry["ops"][:6])
        layout = entry["attention_layer"]
        lines.append(f"- **{name}** ({entry['step_ms']:.0f} ms/step profiled): {ops}. One layer's decode attention "
                     f"(SDPA): {layout['token_major_ms']:.2f} ms over the token-major home, "
                     f"{layout['contiguous_ms']:.2f} ms over the same K/V contiguous.")
    return lines + [""]


def _their(record: dict, key: str) -> str:
    return next((str(r.get(key)) for r in record["runs"] if r["side"] == "theirs" and r.get(key)), "?")


def _fmt(value, key: str) -> str:
    if value is None:
        return "-"
    return f"{value / 2**20:,.0f}" if key == "rss" else f"{value:,.1f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-bench", type=Path, default=None, help="llama.cpp's llama-bench binary")
    parser.add_argument("--gguf", type=Path, default=None, help="default: the embedded SmolLM2-135M Q4_1 GGUF")
    parser.add_argument("--contexts", default="2048,8192")
    parser.add_argument("--modes", default="gguf,int8,fp32,bf16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--child", choices=sorted(MODES), help=argparse.SUPPRESS)
    parser.add_argument("--quality", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true",
                        help="only profile our decode (torch.profiler) per mode and context, into the same .json")
    parser.add_argument("--child-profile", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--floor", action="store_true",
                        help="only measure the floor of an exact in-torch engine per context, into the same .json")
    args = parser.parse_args(argv)
    args.contexts = [int(c) for c in args.contexts.split(",")]
    args.modes = args.modes.split(",")
    if args.child and args.child_profile:
        print(json.dumps(profile_child(args.child, args.contexts[0], args.threads, args.gguf)))
        return
    if args.child:
        print(json.dumps(measure_child(args.child, args.contexts[0], args.decode_tokens, args.gguf, args.threads,
                                       args.quality)))
        return
    if args.gguf is None and not args.report_only:
        from engine.models.loader import _embedded_gguf

        args.gguf = _embedded_gguf()
    if args.floor:
        record = json.loads(args.out.read_text())
        record["floor"] = {"stamp": _stamp(), "contexts": floor_rss(args.gguf, args.contexts, record["decode_tokens"])}
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    elif args.profile:
        record = json.loads(args.out.read_text())
        record["profile"] = {f"{mode} {context}": json.loads(_run(
            [sys.executable, "-m", "benchmarks.weights.llamacpp_compare", "--child", mode, "--child-profile", "--contexts",
             str(context), "--gguf", str(args.gguf), "--threads", str(args.threads)])[0].strip().splitlines()[-1])
            for mode in args.modes for context in args.contexts}
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    elif not args.report_only:
        record = measure(args)
        previous = json.loads(args.out.read_text()) if args.out.exists() else {}
        record["notes"] = previous.get("notes", [])  # the reading of the figures is kept across runs
        args.out.parent.mkdir(parents=True, exist_ok=True)  # (a run of many minutes must not fail at its last line)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    write_markdown(json.loads(args.out.read_text()), args.out)


if __name__ == "__main__":
    main()
