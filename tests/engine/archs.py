"""Tiny random configs of every supported architecture, saved and reloaded through the real loader."""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

from engine.loader import load_model

_COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=97, max_position_embeddings=256)


def tiny_configs() -> dict[str, object]:
    """name -> config; covers MHA, GQA, MQA, sliding windows shorter than the prompts, Gemma 2's softcap."""
    return {
        "llama-gqa": LlamaConfig(**_COMMON),
        "llama-mha": LlamaConfig(**{**_COMMON, "num_key_value_heads": 4}),
        "llama-mqa": LlamaConfig(**{**_COMMON, "num_key_value_heads": 1}),
        "mistral-window": MistralConfig(**_COMMON, sliding_window=8),
        "qwen2-window": Qwen2Config(**_COMMON, use_sliding_window=True, sliding_window=8, max_window_layers=1,
                                    layer_types=["full_attention", "sliding_attention", "sliding_attention"]),
        "qwen3": Qwen3Config(**_COMMON, head_dim=16),
        "gemma2-softcap": Gemma2Config(**_COMMON, head_dim=16, sliding_window=8, attn_logit_softcapping=2.0,
                                       final_logit_softcapping=30.0, query_pre_attn_scalar=16),
        "gemma3-window": Gemma3TextConfig(**_COMMON, head_dim=16, sliding_window=8,
                                          layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
    }


def reference_attention(name: str) -> str:
    # Stock transformers runs Gemma 2 with eager attention: SDPA cannot express its logit softcap.
    return "eager" if name.startswith("gemma2") else "sdpa"


def build_pair(name: str, folder, dtype=torch.float32, device="cpu"):
    """(stock model, headinfer model) with identical random weights, the latter via engine.loader."""
    torch.manual_seed(1234)
    config = tiny_configs()[name]
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(folder)
    stock = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=reference_attention(name))
    headinfer, _ = load_model(str(folder), device=device, dtype=_dtype_name(dtype), with_tokenizer=False)
    return stock.to(device).eval(), headinfer


def _dtype_name(dtype) -> str:
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
