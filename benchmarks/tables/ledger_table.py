"""The allocation ledger's table for a Llama-3-8B shape at 8K on the CPU: planned vs allocated, by category.

No weights are needed: the cache is made from the real config and fed random K/V of the real shape ([1, 8, Q, 128]
per layer, bf16) through its ``update`` path, chunk by chunk, as the model's attention layers would; the
allocation ledger records every buffer. Run: ``python -m benchmarks.tables.ledger_table`` (about 2-3 GiB of RAM).
"""

from __future__ import annotations

import argparse

import torch
from transformers import LlamaConfig

from engine import HeadInferCache
from engine.kv import route
from engine.kv.ledger import CATEGORIES

MODES = {"resident (CPU default)": {}, "offloaded (resident 0)": {"resident_slots": 0},
         "int8": {"kv_dtype": "int8"}}


def llama3_8b() -> LlamaConfig:
    return LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=8192,
                       dtype="bfloat16")


@torch.inference_mode()
def fill(cache: HeadInferCache, tokens: int, chunk: int) -> None:
    for start in range(0, tokens, chunk):
        q_len = min(chunk, tokens - start)
        for layer in cache.layers:
            kv = torch.randn(2, 1, 8, q_len, 128, dtype=torch.bfloat16)
            layer.update(kv[0], kv[1])
            route.clear()  # (no attention runs here: nothing takes the route)


def table(context: int, chunk: int) -> str:
    lines = [f"Llama-3-8B shape (32 layers, 8 KV heads, head_dim 128, bf16), context {context:,}, chunk {chunk:,}, "
             "CPU; MiB", ""]
    for mode, options in MODES.items():
        cache = HeadInferCache(llama3_8b(), device="cpu", dtype=torch.bfloat16, max_context=context,
                               chunk_size=chunk, host_memory=64 << 30, **options)  # (no weights are loaded)
        fill(cache, context, chunk)
        planned = cache.plan.allocations
        lines += [f"**{mode}**", "", "| category | planned | allocated (peak) |", "|---|---:|---:|"]
        for category in CATEGORIES:
            lines.append(f"| {category} | {planned[category] / 2**20:,.2f} | {cache.ledger.peak(category) / 2**20:,.2f} |")
        lines += [f"| **total** | {cache.plan.allocations_total / 2**20:,.2f} | {cache.ledger.peak() / 2**20:,.2f} |", ""]
        cache.release()
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--chunk", type=int, default=4096)
    args = parser.parse_args()
    print(table(args.context, args.chunk))


if __name__ == "__main__":
    main()
