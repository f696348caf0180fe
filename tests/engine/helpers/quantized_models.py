"""Tiny models quantized two ways for the quantized-weights parity tests: by the library through transformers'
quantizer with stock attention, and through ``load_model(weights=...)`` with head-wise attention."""

from __future__ import annotations

import torch
from archs import reference_attention, tiny_configs
from transformers import AutoModelForCausalLM

from engine.models.loader import load_model
from engine.models.quantized import SCHEMES, quantization_config


def config_of(name: str):
    """The family's tiny config, its feed-forward 128 wide: bitsandbytes' CPU nf4 kernel needs a linear layer's
    input a multiple of its 64-weight blocks (the tiny configs' 96 is not; real models' widths are). The linear
    attention's 4-row gate projections stay narrower than its 32-row packs: left dense by the loader. An MoE's
    experts 64 wide: nf4 blocks fill their rows (``quantized_experts.quantizable``)."""
    config = tiny_configs()["qwen3.5-moe-published"].text_config if name == "qwen3.5-moe" else tiny_configs()[name]
    config.intermediate_size = 128
    if getattr(config, "moe_intermediate_size", None):
        config.moe_intermediate_size = 64
    return config


def quantized_pair(name: str, scheme: str, folder):
    """(stock model quantized by the library with its reference attention, the same via ``load_model``)."""
    torch.manual_seed(1234)
    AutoModelForCausalLM.from_config(config_of(name)).save_pretrained(folder)
    model, _ = load_model(str(folder), device="cpu", dtype="float32", weights=scheme, with_tokenizer=False)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config_of(name))
    stock = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation=reference_attention(name), device_map={"": "cpu"},
        quantization_config=quantization_config(SCHEMES[scheme], torch.float32, "cpu", lambda: skeleton)).eval()
    return stock, model
