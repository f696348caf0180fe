"""The 27B hybrid a 4090 owner runs (issue 49): Qwen3.6-27B's shape, random weights, 4-bit (bitsandbytes nf4).

The catalogue's Qwen3.6-27B (engine/models/catalogue.json): 64 layers, every 4th full attention (16 keep KV: 4 KV
heads of 256, 64 KiB of bf16 KV a token), the other 48 Gated DeltaNet. The linear-attention widths are the
published Qwen3.5-27B config's. Built in bf16 on the device and quantized a linear layer at a time, as the
loader's ``bnb-nf4`` holds them (blocks of 64, fp32 absmax, embeddings and lm_head dense): the bf16 copy is never
whole on a 24 GiB budget, only on the bigger card the run emulates it on.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

#: Qwen3.6-27B's text model; max_position_embeddings past 1M so the decode at 1M tokens has its positions
QWEN36_27B = dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=64, num_attention_heads=24,
                  num_key_value_heads=4, head_dim=256, vocab_size=248320, full_attention_interval=4,
                  linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
                  linear_value_head_dim=128, max_position_embeddings=1 << 21, tie_word_embeddings=False)

#: the same layout at a CPU's size (the smoke run): 4 layers, one with KV
TINY_HYBRID = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=8,
                   num_key_value_heads=4, head_dim=64, vocab_size=512, full_attention_interval=4,
                   linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
                   max_position_embeddings=1 << 16, tie_word_embeddings=False)

HYBRID_MODELS = {"qwen3.6-27b": QWEN36_27B, "tiny-hybrid": TINY_HYBRID}
NF4_BLOCK = 64  # as engine.models.quantized's bnb-nf4


def hybrid_config(name: str):
    """A Qwen3.5-family text config (transformers' ``qwen3_5``), or Qwen3-Next's where that is all it has."""
    fields = dict(HYBRID_MODELS[name])
    interval = fields.pop("full_attention_interval")
    layers = fields["num_hidden_layers"]
    fields["layer_types"] = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    try:
        from transformers import Qwen3_5TextConfig as config_class
    except ImportError:  # an older transformers: the same layer kinds, a MoE feed-forward made dense-sized
        from transformers import Qwen3NextConfig as config_class

        fields.update(num_experts=0, mlp_only_layers=list(range(layers)))
    return config_class(**fields)


def build_random_nf4(name: str, device: str | torch.device, dtype: torch.dtype):
    """The hybrid ``name`` with random weights on ``device``, its linear layers (not the lm_head) in nf4."""
    import bitsandbytes as bnb
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = hybrid_config(name)
    logger.info("building a random %s (%s layers) on %s, nf4 linear layers", name, config.num_hidden_layers, device)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa").eval()
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear or child is model.get_output_embeddings():
                continue
            if child.in_features % NF4_BLOCK:  # (a tiny shape's odd widths stay dense, as quantized.py's would)
                continue
            layer = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                      compute_dtype=dtype, compress_statistics=False, quant_type="nf4",
                                      quant_storage=torch.uint8, device="meta")
            layer.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, blocksize=NF4_BLOCK,
                                             compress_statistics=False, quant_type="nf4",
                                             quant_storage=torch.uint8).to(child.weight.device)
            if child.bias is not None:
                layer.bias = child.bias
            setattr(parent, child_name, layer)
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()  # the bf16 copies' blocks: before the run's budget caps the allocator
    return model
