"""Quantized weights through the libraries (``load_model(weights=...)``, engine/models/quantized.py), on whatever
device this machine has: per mode, the weight bytes held (against dense and against what the planner assumes,
``bytes_per_weight``), and decode ms/token after ``--context`` tokens of random K/V, head-wise (a HeadInferCache)
against the same library's stock decode (the same quantized model with sdpa and a DynamicCache).

A random model of a named shape (no download), saved once; every mode in a fresh process (its own peak memory),
the two attentions alternating within it. The table says which library each of "8bit" / "4bit" should be on this
device: the GPU run decides ``PREFERENCE`` in engine/models/quantized.py. A mixture-of-experts shape (``moe-*``,
Qwen3-MoE's layout) goes in the report's own table, with ``bnb-nf4-dense-experts``: transformers' own nf4 quantizer,
whose experts stay dense, against ``bnb-nf4``'s nf4 experts (engine/models/quantized_experts.py).

    .venv/bin/python -m benchmarks.weights.quantized_weights                        # the CPU: a 78M llama shape
    .venv/bin/python -m benchmarks.weights.quantized_weights --shape moe-small --modes dense,bnb-nf4-dense-experts,bnb-nf4
    .venv/bin/python -m benchmarks.weights.quantized_weights --device cuda --shape 1.5b
    .venv/bin/python -m benchmarks.weights.quantized_weights --report-only
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ..harness.layout import report_of

OUT = Path("docs/benchmarks/data/quantized-weights.json")
#: name -> llama config fields. small: fits the CPU runs; 1.5b: Qwen2.5-1.5B's widths; 8b: Llama 3.1 8B's.
SHAPES = {
    "small": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=4, num_attention_heads=16,
                  num_key_value_heads=4, vocab_size=8192),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256),
    # Qwen3-MoE's layout at a CPU's size: 16 experts of 512, 4 routed a token (Qwen3-30B-A3B: 128 of 768, 8)
    "moe-small": dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=8,
                      num_key_value_heads=2, head_dim=64, vocab_size=8192, num_experts=16, num_experts_per_tok=4,
                      moe_intermediate_size=512),
    # A GPU's: 8 layers of 32 experts of 768 (2.4 GB of bf16 experts), for the load's peak (the gpu_all step)
    "moe-gpu": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=8, num_attention_heads=16,
                    num_key_value_heads=4, head_dim=128, vocab_size=8192, num_experts=32, num_experts_per_tok=8,
                    moe_intermediate_size=768),
}
DENSE_EXPERTS = "bnb-nf4-dense-experts"  # transformers' nf4 quantizer alone: the fused experts stay dense


def child(folder: str, mode: str, device: str, context: int, steps: int) -> dict:
    """In the child process: the mode's head-wise model and its stock twin, held bytes and decode steps."""
    import time

    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    import engine
    from engine.models.weights_mode import weights_mode
    from engine.models.loader import load_model
    from engine.models.quantized import SCHEMES, bytes_per_weight, fused_experts_params, quantization_config
    from engine.planning.budgets import held_bytes, num_weights
    from engine.types import ModelShape

    from ..harness.fill import fill_random

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    skeleton = None
    if device != "cpu":  # the load's own peak: dense experts pass through the device, nf4 ones never whole
        torch.cuda.reset_peak_memory_stats()
    if mode == DENSE_EXPERTS:
        kwargs = {"quantization_config": quantization_config(SCHEMES["bnb-nf4"], dtype, device)}  # (no skeleton)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="headinfer",
                                                     device_map={"": device}, **kwargs).eval()
        loaded = DENSE_EXPERTS
    else:
        model, _ = load_model(folder, device=device, dtype=str(dtype).removeprefix("torch."), weights=mode,
                              with_tokenizer=False)
        loaded = weights_mode(model)
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(model.config)
        kwargs = {"quantization_config": quantization_config(SCHEMES[loaded], dtype, device, lambda: skeleton)} \
            if loaded in SCHEMES else {}
    load_peak = torch.cuda.max_memory_allocated() if device != "cpu" else None
    stock = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa",
                                                 device_map={"": device}, **kwargs).eval()
    shape = ModelShape.from_config(model.config)
    linear = sum(m.in_features * m.out_features for name, m in model.named_modules()
                 if hasattr(m, "in_features") and name != "lm_head") + fused_experts_params(model.config)
    caches = {"head-wise": engine.HeadInferCache(model.config, device=device, dtype=dtype,
                                                 max_context=context + steps + 4),
              "stock": DynamicCache(config=stock.config)}
    seconds: dict[str, list[float]] = {name: [] for name in caches}
    with torch.inference_mode():
        for cache in caches.values():
            fill_random(cache, context, head_dim=shape.head_dim, num_kv_heads=shape.num_kv_heads,
                        device=torch.device(device), dtype=dtype)
        tokens = {name: torch.tensor([[1]], device=device) for name in caches}
        for step in range(steps + 2):
            for name, runner in (("head-wise", model), ("stock", stock)):
                if device != "cpu":
                    torch.cuda.synchronize()
                begin = time.perf_counter()
                out = runner(tokens[name], past_key_values=caches[name], use_cache=True).logits[:, -1]
                tokens[name] = out.argmax(-1, keepdim=True)
                if device != "cpu":
                    torch.cuda.synchronize()
                if step >= 2:  # the first steps build kernels and touch the weights for the first time
                    seconds[name].append(time.perf_counter() - begin)
    planned = bytes_per_weight("bnb-nf4" if loaded == DENSE_EXPERTS else loaded, device, dtype_bytes=dtype.itemsize)
    return {"mode": mode, "loaded": loaded, "held_bytes": held_bytes(model), "num_weights": num_weights(model),
            "linear_weights": linear, "planned_bytes_per_weight": planned, "load_peak_bytes": load_peak,
            "headwise_s": seconds["head-wise"], "stock_s": seconds["stock"]}


def run_child(folder: str, mode: str, args) -> dict | None:
    command = [sys.executable, "-m", "benchmarks.weights.quantized_weights", "--child", folder, mode, "--device",
               args.device, "--context", str(args.context), "--steps", str(args.steps)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"{mode}: not measured here ({done.stderr.strip().splitlines()[-1][:200]})", flush=True)
        return {"mode": mode, "error": done.stderr.strip().splitlines()[-1][:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3MoeConfig

    from ..records import run_stamp

    record = {"stamp": run_stamp(args.device), "shape": args.shape, "context": args.context, "runs": []}
    with tempfile.TemporaryDirectory(prefix="quantized-weights-") as folder:
        torch.manual_seed(0)
        family = Qwen3MoeConfig if args.shape.startswith("moe") else LlamaConfig
        config = family(**SHAPES[args.shape], max_position_embeddings=max(4096, 2 * args.context))
        dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
        AutoModelForCausalLM.from_config(config, dtype=dtype).save_pretrained(folder)
        for mode in args.modes.split(","):
            result = run_child(folder, mode, args)
            record["runs"].append(result)
            if "error" not in result:
                print(f"{mode} ({result['loaded']}): held {result['held_bytes'] / 2**20:,.0f} MiB, head-wise "
                      f"{statistics.median(result['headwise_s']) * 1000:.1f} ms, stock "
                      f"{statistics.median(result['stock_s']) * 1000:.1f} ms", flush=True)
    return record


def write_markdown(record: dict, path: Path) -> None:
    stamp = record["stamp"]
    lines = [f"# Quantized weights on {stamp['device']}: bytes held and decode against the same library's stock "
             f"({stamp['date'][:10]})", "",
             f"`python -m benchmarks.weights.quantized_weights --device {stamp['device']} --shape {record['shape']}`;"
             f" {stamp['machine']}, {stamp.get('gpu') or 'no GPU'}, torch {stamp['torch']}, transformers "
             f"{stamp['transformers']}, load average {stamp.get('load_avg')}. A random llama of the `{record['shape']}`"
             f" shape; decode: ms per token after {record['context']:,} tokens of random K/V, the median of each "
             "mode's steps, head-wise (HeadInferCache) and stock (the same quantized model, sdpa, DynamicCache) "
             "alternating. Held: parameters and buffers (a torchao tensor's inner tensors, bitsandbytes' scales). "
             "Bytes/weight: the linear layers' bytes per weight (embeddings and norms at dense size taken out), "
             "measured and as the planner assumes (`bytes_per_weight`).", "",
             *_table(record)]
    failed = [run for run in record["runs"] if "error" in run]
    if failed:
        lines += ["", "Not measured on this device: " + "; ".join(f"`{r['mode']}` ({r['error']})" for r in failed)]
    for note in record.get("notes", []):
        lines += ["", note]
    moe = record.get("moe")
    if moe:
        lines += ["", f"## A mixture of experts: the fused experts in nf4 or dense ({moe['stamp']['date'][:10]})", "",
                  f"`python -m benchmarks.weights.quantized_weights --shape {moe['shape']} --modes "
                  f"{','.join(run['mode'] for run in moe['runs'])}`; load average {moe['stamp'].get('load_avg')}. A "
                  f"random Qwen3-MoE of the `{moe['shape']}` shape ({_moe_words(moe['shape'])}); decode after "
                  f"{moe['context']:,} tokens as above. `{DENSE_EXPERTS}`: transformers' own nf4 quantizer, the "
                  "experts left dense; `bnb-nf4`: the experts in nf4 too, the routed ones expanded per step "
                  "(engine/models/quantized_experts.py). Bytes/weight: every weight but the embeddings and norms.",
                  "", *_table(moe)]
        lines += [note for note in moe.get("notes", []) for note in ("", note)]
    report_of(path).write_text("\n".join(lines + [""]))


def _moe_words(shape: str) -> str:
    fields = SHAPES[shape]
    return (f"{fields['num_hidden_layers']} layers, {fields['num_experts']} experts of {fields['moe_intermediate_size']}"
            f", {fields['num_experts_per_tok']} routed a token")


def _table(record: dict) -> list[str]:
    runs = [run for run in record["runs"] if "error" not in run]
    dense = next((run for run in runs if run["loaded"] == "dense"), None)
    lines = ["| mode | scheme | held MiB | x dense | bytes/weight | planned | head-wise ms | stock ms | x stock |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        head, stock = (statistics.median(run[key]) * 1000 for key in ("headwise_s", "stock_s"))
        ratio = f"{run['held_bytes'] / dense['held_bytes']:.2f}" if dense else "?"
        per_weight = "?"
        if dense:  # what the linear layers hold: the rest (embeddings, norms) is dense in both
            rest = dense["held_bytes"] - run["linear_weights"] * dense["planned_bytes_per_weight"]
            per_weight = f"{(run['held_bytes'] - rest) / run['linear_weights']:.3f}"
        planned = run["planned_bytes_per_weight"]
        lines.append(f"| {run['mode']} | {run['loaded']} | {run['held_bytes'] / 2**20:,.1f} | {ratio} | "
                     f"{per_weight} | {planned if planned is not None else '?'} | {head:.1f} | {stock:.1f} | "
                     f"{head / stock:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--shape", default="small", choices=sorted(SHAPES))
    parser.add_argument("--modes", default="dense,bnb-int8,torchao-int8,torchao-fp8,bnb-nf4,torchao-int4")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None, help=f"default: {OUT} (-cuda for a GPU run)")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("FOLDER", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.device, args.context, args.steps)))
        return
    out = args.out or (OUT if args.device == "cpu" else OUT.with_name(OUT.stem + "-cuda.json"))
    if not args.report_only:
        record = measure(args)
        previous = json.loads(out.read_text()) if out.exists() else {}
        if args.shape.startswith("moe"):  # its own section of the record: the dense shapes' runs stay
            record["notes"] = previous.get("moe", {}).get("notes", [])
            record = {**previous, "moe": record}
        else:
            record["notes"] = previous.get("notes", [])
            record["moe"] = previous.get("moe")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=1) + "\n")
    record = json.loads(out.read_text())
    if "stamp" in record:  # (a MoE section alone, as the gpu_all step writes one to a folder of its own: no report)
        write_markdown(record, out)


if __name__ == "__main__":
    main()
