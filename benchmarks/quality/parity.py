"""Parity report: max relative logit difference, head-wise vs stock, per architecture and dtype.

    python -m benchmarks.quality.parity [--device cuda] [--dtype float32 bfloat16] [--out docs/parity-cpu.md]

Runs the tiny random configs of every supported family (tests/engine/helpers/archs.py) through chunked prefill
and decode with every head-group size and both KV homes (device-resident and offloaded ping-pong),
and checks greedy generate() tokens. Prints a markdown table and writes it to --out.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "engine" / "helpers"))

from archs import build_pair, tiny_configs  # noqa: E402

import engine  # noqa: E402

PROMPT_LEN, DECODE_STEPS, CHUNKS = 45, 12, (1, 7, 16, 45)


def rel(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.float() - expected.float()).abs().max() / expected.float().abs().max())


@torch.inference_mode()
def measure(name: str, dtype: torch.dtype, device: str) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        stock, headinfer = build_pair(name, Path(folder), dtype=dtype, device=device)
    ids = torch.randint(0, stock.config.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(7))
    ids = ids.to(device)
    expected = stock(ids).logits
    worst_prefill = worst_decode = 0.0
    for resident in (None, 0):
        for group in (d for d in range(1, stock.config.num_key_value_heads + 1) if stock.config.num_key_value_heads % d == 0):
            for chunk in CHUNKS:
                cache = engine.HeadInferCache(headinfer.config, head_group_size=group, resident_slots=resident,
                                              device=device)
                logits = torch.cat([headinfer(ids[:, s : s + chunk], past_key_values=cache).logits
                                    for s in range(0, PROMPT_LEN, chunk)], dim=1)
                worst_prefill = max(worst_prefill, rel(logits, expected))
            stock_cache = DynamicCache(config=stock.config)
            ref = stock(ids, past_key_values=stock_cache).logits[:, -1]
            token = ref.argmax(-1, keepdim=True)
            for _ in range(DECODE_STEPS):
                ref = stock(token, past_key_values=stock_cache).logits[:, -1]
                worst_decode = max(worst_decode, rel(headinfer(token, past_key_values=cache).logits[:, -1], ref))
                token = ref.argmax(-1, keepdim=True)
    kwargs = dict(max_new_tokens=20, min_new_tokens=20, do_sample=False)
    same_tokens = torch.equal(
        stock.generate(ids, **kwargs),
        headinfer.generate(ids, past_key_values=engine.HeadInferCache(headinfer.config, resident_slots=0,
                                                                      device=device),
                           prefill_chunk_size=16, **kwargs))
    return {"arch": name, "dtype": str(dtype).removeprefix("torch."), "prefill": worst_prefill,
            "decode": worst_decode, "greedy_identical": same_tokens}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", nargs="+", default=["float32"])
    parser.add_argument("--out", type=Path, default=Path("docs/parity-cpu.md"))
    args = parser.parse_args(argv)
    rows = [measure(name, getattr(torch, dt), args.device) for dt in args.dtype for name in sorted(tiny_configs())]
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "CPU"
    lines = [
        f"# Parity: head-wise vs stock transformers ({args.device})",
        "",
        f"{datetime.date.today()} · {device_name} · torch {torch.__version__} · transformers {transformers.__version__}",
        "",
        f"Prompt {PROMPT_LEN} tokens; chunk sizes {CHUNKS}; every head-group size; KV homes resident and offloaded "
        f"(ping-pong); {DECODE_STEPS} decode steps; max relative logit difference = max|a-b| / max|b|.",
        "",
        "| architecture | dtype | prefill max rel diff | decode max rel diff | greedy tokens identical |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {r['arch']} | {r['dtype']} | {r['prefill']:.2e} | {r['decode']:.2e} | {r['greedy_identical']} |"
              for r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
