"""Tiny random configs of every supported architecture, saved and reloaded through the real loader."""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    Cohere2Config,
    Gemma2Config,
    Gemma3TextConfig,
    Gemma4Config,
    Gemma4TextConfig,
    Glm4Config,
    GraniteConfig,
    GraniteMoeHybridConfig,
    Lfm2Config,
    LlamaConfig,
    MistralConfig,
    Olmo2Config,
    Olmo3Config,
    Phi3Config,
    Qwen2Config,
    Qwen3_5Config,
    Qwen3_5MoeConfig,
    Qwen3_5TextConfig,
    Qwen3Config,
    Qwen3MoeConfig,
    Qwen3NextConfig,
)

from engine.models.loader import WRAPPED_TEXT_TYPES, load_model

_COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=97, max_position_embeddings=256)


def tiny_configs() -> dict[str, object]:
    """name -> config; covers MHA, GQA, MQA, sliding windows shorter than the prompts, Gemma 2's softcap,
    partial rotary, LongRoPE, head_dim != hidden / heads, MoE feed-forwards and attention multipliers."""
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
        # Phi-3/4: LongRoPE (short factors and the attention factor; the long factors are tested apart, see
        # ``longrope_past_original_config``) on half of each head (partial rotary).
        "phi3-longrope": _phi3(original_max_position_embeddings=128),
        # Mistral-Nemo: head_dim 24 while hidden / heads = 16.
        "mistral-nemo-head-dim": MistralConfig(**_COMMON, head_dim=24),
        "glm4": Glm4Config(**_COMMON, head_dim=16, partial_rotary_factor=0.5, pad_token_id=0),
        "qwen3-moe": Qwen3MoeConfig(**_COMMON, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                    moe_intermediate_size=32),
        "cohere2-window": Cohere2Config(**_COMMON, sliding_window=8, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                        layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
        "olmo2": Olmo2Config(**_COMMON, pad_token_id=0, eos_token_id=2),
        "granite": GraniteConfig(**_COMMON, attention_multiplier=0.2, embedding_multiplier=2.0,
                                 residual_multiplier=0.5, logits_scaling=4.0),
        # Hybrids: the state layers (convolution, gated delta-net linear attention) get no homes and no fetches.
        "lfm2-hybrid": Lfm2Config(**_COMMON, layer_types=["conv", "full_attention", "conv"]),
        "qwen3-next-hybrid": Qwen3NextConfig(**_COMMON, **_LINEAR, num_experts=4, num_experts_per_tok=2,
                                             moe_intermediate_size=32, shared_expert_intermediate_size=32),
        "qwen3.5-hybrid": Qwen3_5TextConfig(**_COMMON, **_LINEAR),
        # Qwen3.5/3.6 as published: the multimodal wrapper (a vision tower beside the text model), dense and MoE.
        "qwen3.5-published": Qwen3_5Config(text_config=dict(**_COMMON, **_LINEAR), vision_config=_QWEN3_5_VISION),
        "qwen3.5-moe-published": Qwen3_5MoeConfig(vision_config=_QWEN3_5_VISION, text_config=dict(
            **_COMMON, **_LINEAR, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=32)),
        "olmo3-window": Olmo3Config(**_COMMON, sliding_window=8, pad_token_id=0, eos_token_id=2,
                                    layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
        # Granite 4: Mamba-2 layers (a fixed-size conv + SSM state) around an attention layer without RoPE, MoE.
        "granite4-hybrid": GraniteMoeHybridConfig(
            **_COMMON, layer_types=["linear_attention", "full_attention", "linear_attention"],
            position_embedding_type="nope", mamba_n_heads=4, mamba_d_head=32, mamba_d_state=16, mamba_chunk_size=16,
            num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=32, attention_multiplier=0.2,
            embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=4.0,
            eos_token_id=None),  # (its default, token 2, ties for first after one of test_hybrid's prompts)
        # Gemma 4: global layers with their own head_dim (32 against 16) and proportional partial RoPE; per-layer
        # inputs; the last two layers attending the K/V of the last sliding and global layers before them (KV
        # sharing); global layers with their own KV heads where K is V (31B, 26B-A4B), with the MoE block beside
        # the MLP; and the multimodal checkpoint as published.
        "gemma4-head-dims": Gemma4TextConfig(**_GEMMA4),
        "gemma4-shared-kv": Gemma4TextConfig(**{**_GEMMA4, "num_hidden_layers": 6, "num_kv_shared_layers": 2,
                                                "layer_types": ["sliding_attention", "full_attention"] * 3}),
        "gemma4-global-kv": Gemma4TextConfig(**{**_GEMMA4, "hidden_size_per_layer_input": 0}, attention_k_eq_v=True,
                                             num_global_key_value_heads=1, enable_moe_block=True, num_experts=4,
                                             top_k_experts=2, moe_intermediate_size=32),
        "gemma4-published": Gemma4Config(text_config=_GEMMA4, vision_config=_GEMMA4_VISION, audio_config=None),
    }


_LINEAR = dict(head_dim=16, layer_types=["linear_attention", "full_attention", "linear_attention"],
               linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4)
_QWEN3_5_VISION = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64)
_GEMMA4 = dict(**{**_COMMON, "num_hidden_layers": 4}, head_dim=16, global_head_dim=32, sliding_window=8,
               layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
               hidden_size_per_layer_input=8, vocab_size_per_layer_input=97, final_logit_softcapping=30.0)
_GEMMA4_VISION = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, head_dim=16, patch_size=4, position_embedding_size=64)


def _phi3(original_max_position_embeddings: int) -> Phi3Config:
    rope = {"rope_type": "longrope", "partial_rotary_factor": 0.5, "short_factor": [1.0, 1.1, 1.2, 1.3],
            "long_factor": [2.0, 3.0, 4.0, 5.0]}  # rotary dims / 2 = 16 * 0.5 / 2 entries
    return Phi3Config(**_COMMON, partial_rotary_factor=0.5, rope_parameters=rope, pad_token_id=0, eos_token_id=2,
                      original_max_position_embeddings=original_max_position_embeddings)


def longrope_past_original_config() -> Phi3Config:
    """Phi-3 whose prompts run past the original window (32), so LongRoPE switches to its long factors.

    transformers picks short or long factors per forward from its last position, so only a prompt read in one
    forward sees the same rotary angles as stock's (chunked prefill differs in stock transformers too)."""
    return _phi3(original_max_position_embeddings=32)


def reference_attention(name: str) -> str:
    # Stock transformers runs Gemma 2 with eager attention: SDPA cannot express its logit softcap.
    return "eager" if name.startswith("gemma2") else "sdpa"


def build_pair(name: str, folder, dtype=torch.float32, device="cpu", config=None):
    """(stock model, headinfer model) with identical random weights, the latter via engine.models.loader."""
    torch.manual_seed(1234)
    config = config if config is not None else tiny_configs()[name]
    # A multimodal wrapper is saved as published (vision tower and all); both sides load its text model from that.
    auto = AutoModelForImageTextToText if config.model_type in WRAPPED_TEXT_TYPES else AutoModelForCausalLM
    model = auto.from_config(config, dtype=dtype)
    model.save_pretrained(folder)
    stock = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=reference_attention(name))
    headinfer, _ = load_model(str(folder), device=device, dtype=_dtype_name(dtype), with_tokenizer=False)
    return stock.to(device).eval(), headinfer


def _dtype_name(dtype) -> str:
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]


def llama3_8b_config() -> LlamaConfig:
    """Llama 3 8B's shapes (no weights): what the planner's tests plan for."""
    return LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=128, vocab_size=128256)
