"""Models the benchmarks run: Llama-3-8B-shaped random weights built on the device, tiny ones for tests, SmolLM2,
the 27B hybrid in nf4 (``hybrid.py``)."""

from __future__ import annotations

import logging

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import engine  # noqa: F401  (registers the "headinfer" attention the modes load models with)
from engine.models.loader import load_model

from .hybrid import HYBRID_MODELS, build_random_nf4

logger = logging.getLogger(__name__)

#: Llama-3-8B's shape (docs/benchmarks/method.md): 15 GiB of bf16 weights, 128 KiB of KV per token
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128, vocab_size=128256, rope_theta=500000.0,
                 max_position_embeddings=1 << 23, tie_word_embeddings=False)

#: small enough for CPU tests, with Llama-3-8B's 8 KV heads (so every head-group size 8/4/2/1 applies)
TINY_LLAMA = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=8, vocab_size=512, max_position_embeddings=1 << 16,
                  tie_word_embeddings=False)


def llama3_8b_config() -> LlamaConfig:
    return LlamaConfig(**LLAMA3_8B)


def tiny_llama_config() -> LlamaConfig:
    return LlamaConfig(**TINY_LLAMA)


def build_random(config, *, device: str | torch.device, dtype: torch.dtype, attn_implementation: str):
    """A model with random (normal, non-zero) weights created directly on ``device`` (no host copy)."""
    torch.manual_seed(0)
    logger.info("building a random %s-layer model on %s in %s", config.num_hidden_layers, device, dtype)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    return model.eval()


def load_smollm2():
    """The embedded SmolLM2-135M on CPU in float32 (stock SDPA attention until a mode switches it)."""
    model, _ = load_model(None, device="cpu", dtype="float32", attn_implementation="sdpa", weights="dense")
    return model


def build_model(name: str, device: str | torch.device, dtype: torch.dtype | None = None):
    """``llama3-8b`` (bf16, on ``device``), ``tiny`` (random, fp32 on CPU / bf16 on CUDA), ``smollm2`` (CPU), or a
    hybrid of ``benchmarks.harness.hybrid`` (``qwen3.6-27b``, ``tiny-hybrid``: nf4 linear layers)."""
    if name == "smollm2":
        return load_smollm2()
    is_cuda = torch.device(device).type == "cuda"
    dtype = dtype or (torch.bfloat16 if is_cuda else torch.float32)
    if name in HYBRID_MODELS:
        return build_random_nf4(name, device, dtype)
    config = {"llama3-8b": llama3_8b_config, "tiny": tiny_llama_config}[name]()
    return build_random(config, device=device, dtype=dtype, attn_implementation="sdpa")


def set_attention(model, implementation: str) -> None:
    """Switches the attention implementation of a loaded model in place (no reload)."""
    if getattr(model.config, "_attn_implementation", None) == implementation:
        return
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(implementation)
    else:  # older transformers: the config field is what the layers read
        model.config._attn_implementation = implementation


def random_ids(model, length: int, *, device, seed: int = 0) -> torch.Tensor:
    """[1, length] random token ids (never a constant prompt: it can run faster than real text)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, length), generator=generator)
    return ids.to(device)
