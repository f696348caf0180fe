"""A GGUF's blocks held as they are and expanded with torch per layer (``engine.models.gguf_device``, the GPU path of
``weights="gguf"``), measured where it runs: on the CPU (forced with ``HEADINFER_GGUF_TORCH=1``) and on CUDA if
present. Per mode: the weights' bytes held against the file's tensor bytes, decode ms/token after 1K tokens of random
K/V, the greedy tokens against dense's; then the expansion's own speed on 27B-sized layers, and from it its share of
a decode step at long context, where a step is the KV's bytes over the host link.

Every model measurement is a fresh process (the modes alternate within each round).

    .venv/bin/python -m benchmarks.weights.gguf_device               # the embedded SmolLM2 (Q4_1 + Q8_0)
    .venv/bin/python -m benchmarks.weights.gguf_device --report-only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from ..harness.layout import report_of

OUT = Path("docs/benchmarks/data/gguf-device.json")
PROMPT = "Write a Python function that returns the n-th Fibonacci number."
#: mode -> (device, load_model weights, torch expansion forced on the CPU)
CPU_MODES = {"dense fp32 (cpu)": ("cpu", "dense", False), "gguf C kernel (cpu)": ("cpu", "gguf", False),
             "gguf torch expansion (cpu)": ("cpu", "gguf", True)}
CUDA_MODES = {"dense bf16 (cuda)": ("cuda", "dense", False), "gguf torch expansion (cuda)": ("cuda", "gguf", False)}
# A Qwen3.6-27B-shaped hybrid (hidden 5120, FFN 17408, 64 layers, 16 of them keeping KV): ~26.9e9 weights in its
# linear layers and tables, held as Q4_K_M holds them (most in Q4_K, a sixth in Q6_K: ffn_down and the embeddings).
MODEL_WEIGHTS = 26.9e9
Q4_K_M_MIX = {"Q4_K": 5 / 6, "Q6_K": 1 / 6}
KV_BYTES_PER_TOKEN = 64 << 10  # bf16 K+V of its 16 full-attention layers (4 KV heads x 256 dims)
LINK_BYTES_S = 24e9  # a PCIe 4.0 x16 link as measured on a 4090 PC
GPU_BANDWIDTH = {"RTX 4090": 1008e9, "H200": 4.8e12}  # nominal memory bandwidth, bytes/s: the expansion's floor


def child(mode: str, context: int, steps: int, threads: int) -> dict:
    """In the child process: load the embedded GGUF in ``mode``, its held bytes, greedy tokens, decode steps."""
    import time

    import torch

    import engine
    from engine.models.gguf_device import gguf_device_bytes
    from engine.models.loader import _embedded_gguf, load_model
    from engine.planning.budgets import held_bytes
    from engine.types import ModelShape

    from ..harness.fill import fill_random

    device, weights, forced = {**CPU_MODES, **CUDA_MODES}[mode]
    if forced:
        os.environ["HEADINFER_GGUF_TORCH"] = "1"
    torch.set_num_threads(threads)
    gguf = _embedded_gguf()
    model, tokenizer = load_model(str(gguf), device=device, weights=weights)
    dtype = next(model.parameters()).dtype
    ids = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                        return_tensors="pt")
    ids = (ids if isinstance(ids, torch.Tensor) else ids["input_ids"]).to(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with torch.inference_mode():
        tokens = model.generate(ids, past_key_values=engine.HeadInferCache(model.config), max_new_tokens=24,
                                do_sample=False)[0, ids.shape[1]:].tolist()
        shape = ModelShape.from_config(model.config)
        cache = engine.HeadInferCache(model.config, device=device, dtype=dtype, max_context=context + steps + 4)
        fill_random(cache, context, head_dim=shape.head_dim, num_kv_heads=shape.num_kv_heads,
                    device=torch.device(device), dtype=dtype)
        token = torch.tensor([[tokens[0]]], device=device)
        seconds = []
        for step in range(steps + 2):
            sync()
            begin = time.perf_counter()
            token = model(token, past_key_values=cache, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
            sync()
            if step >= 2:  # the first steps touch the mapped weights for the first time
                seconds.append(time.perf_counter() - begin)
    return {"mode": mode, "held": held_bytes(model), "file_tensors": gguf_device_bytes(gguf).file_tensors,
            "decode_s": seconds, "tokens": tokens}


def expansion_rates(device: str, repeats: int = 3) -> dict:
    """Seconds per weight to expand Q4_K and Q6_K blocks of a 27B's FFN width (5120 inputs) on ``device`` (bf16 on a
    GPU, fp32 on the CPU; one ``SLICE_BYTES`` slice at a time, as a forward does)."""
    import time

    import numpy as np
    import torch

    from engine.cpu.gguf_blocks import random_block_rows
    from engine.models.gguf_device import expand, slice_rows

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    rows, inputs, rates = slice_rows(5120), 5120, {}
    rng = np.random.default_rng(0)
    for kind, qtype in (("Q4_K", 12), ("Q6_K", 14)):
        raw = random_block_rows(rng, qtype, rows, inputs).to(device)
        expand(raw, qtype, dtype)  # warm-up: the allocator's first blocks
        times = []
        for _ in range(repeats):
            sync()
            begin = time.perf_counter()
            expand(raw, qtype, dtype)
            sync()
            times.append(time.perf_counter() - begin)
        rates[kind] = min(times) / (rows * inputs)
    return {"device": device, "dtype": str(dtype).removeprefix("torch."), "s_per_weight": rates}


def expansion_traffic() -> dict:
    """Bytes each block type's expansion into bf16 reads and writes per weight, summed over the torch ops it runs
    (counted by a dispatch mode on the CPU: the same ops run on a GPU, where elementwise ops are bound by memory)."""
    import numpy as np
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from engine.cpu.gguf_blocks import BLOCK_TYPES, random_block_rows
    from engine.models.gguf_device import expand

    class Traffic(TorchDispatchMode):
        moved = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            # views and allocations move nothing; an out= tensor is counted once, among the arguments
            if not func.is_view and not str(func).startswith(("aten.empty", "aten.new_empty")):
                tensors = tree_flatten((args, kwargs))[0] + ([] if "out" in kwargs else tree_flatten(out)[0])
                self.moved += sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
            return out

    traffic = {}
    for qtype, (kind, _, _) in BLOCK_TYPES.items():
        raw = random_block_rows(np.random.default_rng(0), qtype, 64, 1024)
        with Traffic() as counted:
            expand(raw, qtype, torch.bfloat16)
        traffic[kind] = counted.moved / (64 * 1024)
    return traffic


def run_child(mode: str, args) -> dict:
    command = [sys.executable, "-m", "benchmarks.weights.gguf_device", "--child", mode, "--context",
               str(args.context), "--steps", str(args.steps), "--threads", str(args.threads)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args) -> dict:
    import torch

    from ..records import run_stamp

    modes = {**CPU_MODES, **(CUDA_MODES if torch.cuda.is_available() else {})}
    record = {"stamp": run_stamp("cuda" if torch.cuda.is_available() else "cpu"), "context": args.context,
              "threads": args.threads, "runs": [], "expansion": []}
    for mode in modes:  # converts and caches each mode before anything is timed
        run_child(mode, argparse.Namespace(context=64, steps=1, threads=args.threads))
    for round_index in range(args.rounds):
        for mode in modes:
            result = run_child(mode, args)
            record["runs"].append({"round": round_index, **result})
            print(f"round {round_index} {mode}: decode {statistics.median(result['decode_s']) * 1000:.1f} ms/token, "
                  f"held {result['held'] / 2**20:.1f} MiB (file's tensors {result['file_tensors'] / 2**20:.1f} MiB)",
                  flush=True)
    measure_expansion(record, args.threads)
    return record


def measure_expansion(record: dict, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    record["traffic"] = expansion_traffic()
    record["expansion"] = [expansion_rates(device) for device in ("cpu", *(["cuda"] if torch.cuda.is_available()
                                                                           else []))]
    print(f"expansion: {record['expansion']}; bytes moved a weight: {record['traffic']}", flush=True)


def share_rows(record: dict) -> list[tuple[str, float, float, float]]:
    """(where, the 27B's expansion s/token, its share at 128K, at 1M): as measured on each device here, and the floor
    on each GPU: the bytes its ops move (``expansion_traffic``) at the GPU's nominal bandwidth."""
    def mix(per_kind: dict) -> float:
        return sum(per_kind[kind] * share for kind, share in Q4_K_M_MIX.items())

    rows = [(f"measured on {rates['device']} ({rates['dtype']}, {record['threads']} thread(s) on a CPU)",
             MODEL_WEIGHTS * mix(rates["s_per_weight"])) for rates in record["expansion"]]
    rows += [(f"{gpu} floor: {mix(record['traffic']):.1f} bytes a weight at {bandwidth / 1e9:,.0f} GB/s",
              MODEL_WEIGHTS * mix(record["traffic"]) / bandwidth) for gpu, bandwidth in GPU_BANDWIDTH.items()]
    kv = {tokens: tokens * KV_BYTES_PER_TOKEN / LINK_BYTES_S for tokens in (128 << 10, 1 << 20)}
    return [(where, s, s / (s + kv[128 << 10]), s / (s + kv[1 << 20])) for where, s in rows]


def write_markdown(record: dict, path: Path) -> None:
    stamp = record["stamp"]
    lines = [f"# GGUF blocks on the device, expanded per layer by torch ({stamp['date'][:10]})", "",
             f"`python -m benchmarks.weights.gguf_device`; {stamp['machine']}, torch {stamp['torch']}, "
             f"{record['threads']} thread(s), load average {stamp['load_avg']}. The embedded SmolLM2-135M GGUF (Q4_1 "
             f"layers, a tied Q8_0 table). Held: the model's parameters and buffers (``held_bytes``) against the "
             f"file's tensor bytes. Decode: ms per token after {record['context']:,} tokens of random K/V, head-wise "
             "(median of each run's steps, then of the runs). Same tokens: a 24-token greedy chat answer equals dense's.",
             "", "| mode | held MiB | x file's tensors | decode ms/token | x dense | same tokens |",
             "|---|---:|---:|---:|---:|---|"]
    modes = list(dict.fromkeys(run["mode"] for run in record["runs"]))
    runs = {mode: [r for r in record["runs"] if r["mode"] == mode] for mode in modes}
    decode = {m: statistics.median(statistics.median(r["decode_s"]) for r in rs) * 1000 for m, rs in runs.items()}
    for mode in modes:
        dense = next(m for m in modes if m.startswith("dense") and m.endswith(mode.rsplit(" ", 1)[1]))
        held, file_bytes = runs[mode][0]["held"], runs[mode][0]["file_tensors"]
        same = all(r["tokens"] == runs[dense][0]["tokens"] for r in runs[mode])
        lines.append(f"| {mode} | {held / 2**20:.1f} | {held / file_bytes:.2f} | {decode[mode]:.1f} | "
                     f"{decode[mode] / decode[dense]:.2f}x | {'yes' if same else 'no'} |")
    lines += ["", "## The expansion's share of a decode step at long context", "",
              f"A Qwen3.6-27B-shaped hybrid at Q4_K_M ({MODEL_WEIGHTS / 1e9:.1f}e9 weights: 5/6 Q4_K, 1/6 Q6_K) expands "
              f"every weight once a decode step; its KV is {KV_BYTES_PER_TOKEN >> 10} KiB a token (16 of 64 layers), "
              f"streamed over a {LINK_BYTES_S / 1e9:.0f} GB/s link: {(128 << 10) * KV_BYTES_PER_TOKEN / LINK_BYTES_S:.2f}"
              f" s at 128K tokens, {(1 << 20) * KV_BYTES_PER_TOKEN / LINK_BYTES_S:.2f} s at 1M. Share = expansion / "
              "(expansion + KV transfer), i.e. with no overlap of the two (an upper bound: the expansion runs on the "
              "GPU's memory while the KV crosses the link).", "",
              "| where | expansion s/token | share at 128K | share at 1M |", "|---|---:|---:|---:|"]
    for where, seconds, short, long in share_rows(record):
        lines.append(f"| {where} | {seconds:.2f} | {short:.0%} | {long:.0%} |")
    lines += ["", "Bytes each type's expansion into bf16 moves per weight (its torch ops' reads and writes, counted): "
              + ", ".join(f"{kind} {moved:.1f}" for kind, moved in record["traffic"].items())
              + "; the matmul then reads the bf16 weight (2 bytes), as a dense model's does. Measured per weight: "
              + "; ".join(f"{r['device']} " + ", ".join(f"{k} {v * 1e9:.2f} ns" for k, v in r["s_per_weight"].items())
                          for r in record["expansion"]) + "."]
    for note in record.get("notes", []):
        lines += ["", note]
    report_of(path).write_text("\n".join([*lines, ""]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--expansion-only", action="store_true", help="keep the .json's model runs")
    parser.add_argument("--child", metavar="MODE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.context, args.steps, args.threads)))
        return
    if args.expansion_only:
        record = json.loads(args.out.read_text())
        measure_expansion(record, args.threads)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    elif not args.report_only:
        record = measure(args)
        previous = json.loads(args.out.read_text()) if args.out.exists() else {}
        record["notes"] = previous.get("notes", [])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    write_markdown(json.loads(args.out.read_text()), args.out)


if __name__ == "__main__":
    main()
