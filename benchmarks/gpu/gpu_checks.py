"""Correctness checks that need a long context or CUDA's sanitizer, for the one-call GPU run.

- ``filled_cache_check``: a head-wise cache filled with random K/V (32K tokens by default), one decode step
  through the engine's schedule (ping-pong buffers, side streams) against a reference attention computed in
  fp32 straight from the homes.
- ``python -m benchmarks.gpu.gpu_checks --sanitizer``: a short prefill and decode of a tiny model under
  ``TORCH_CUDA_SANITIZER=1`` (set by the caller before Python starts), printing ``SANITIZER-CLEAN`` when it
  finishes without a reported race.
"""

from __future__ import annotations

import argparse
import logging
import sys

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import engine

from ..harness.fill import fill_random

logger = logging.getLogger(__name__)


@torch.inference_mode()
def filled_cache_check(device: str = "cuda", context: int = 32768, dtype: torch.dtype = torch.bfloat16,
                       head_group_size: int = 1) -> dict:
    """Relative error of one decode step's attention over a filled cache vs a reference (fp32 math)."""
    config = LlamaConfig(hidden_size=1024, intermediate_size=64, num_hidden_layers=2, num_attention_heads=8,
                         num_key_value_heads=4, head_dim=128, vocab_size=97, max_position_embeddings=1 << 20)
    config._attn_implementation = "headinfer"
    cache = engine.HeadInferCache(config, device=device, dtype=dtype, head_group_size=head_group_size,
                                  resident_slots=0, max_context=context + 1, host_memory=1 << 40,
                                  gpu_memory=1 << 40)
    fill_random(cache, context, batch=1, head_dim=128, num_kv_heads=4, device=torch.device(device), dtype=dtype)
    generator = torch.Generator(device=device).manual_seed(0)
    worst = 0.0
    for layer in cache.layers:
        query = torch.randn(1, 8, 1, 128, device=device, dtype=dtype, generator=generator)
        key = torch.randn(1, 4, 1, 128, device=device, dtype=dtype, generator=generator)
        value = torch.randn(1, 4, 1, 128, device=device, dtype=dtype, generator=generator)
        keys, values = layer.update(key, value, layer.layer_idx)
        engine_out = layer.attend(query, keys, values, scaling=128**-0.5, window=None, softcap=None)  # [B, 1, H, D]
        cache.synchronize()
        # Reference from the homes themselves (which now hold the new token too), in fp32.
        k_all = torch.cat([h.keys(0, layer.length) for h in layer.homes], dim=1).to(device).float()  # [1, 4, S, D]
        v_all = torch.cat([h.values(0, layer.length) for h in layer.homes], dim=1).to(device).float()
        q = query.float().reshape(1, 4, 2, 128)  # query heads 2i, 2i+1 share KV head i
        probs = torch.softmax(q @ k_all.transpose(2, 3) * 128**-0.5, dim=-1)
        reference = (probs @ v_all).reshape(1, 8, 128)
        error = (engine_out[:, 0].float() - reference).abs().max() / reference.abs().max()
        worst = max(worst, float(error))
    result = {"context": context, "dtype": str(dtype).removeprefix("torch."), "head_group_size": head_group_size,
              "max_rel_error": worst, "ok": worst < (2e-2 if dtype != torch.float32 else 1e-4)}
    cache.release()
    return result


@torch.inference_mode()
def sanitizer_run(device: str = "cuda") -> None:
    """A short chunked prefill and a few decode steps of a tiny model, head-wise, everything offloaded."""
    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=8,
                         num_key_value_heads=4, head_dim=16, vocab_size=97, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="headinfer", dtype=torch.bfloat16)
    model = model.to(device).eval()
    ids = torch.randint(0, 97, (1, 300), device=device)
    cache = engine.HeadInferCache(model.config, device=device, head_group_size=1, resident_slots=2, chunk_size=64)
    out = model.generate(ids, past_key_values=cache, prefill_chunk_size=64, max_new_tokens=8, do_sample=False)
    torch.cuda.synchronize()
    assert out.shape[1] == 308


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.gpu_checks")
    parser.add_argument("--sanitizer", action="store_true", help="run the short sanitizer workload")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.sanitizer:
        sanitizer_run(args.device)
        print("SANITIZER-CLEAN")
        return 0
    print(filled_cache_check(args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
