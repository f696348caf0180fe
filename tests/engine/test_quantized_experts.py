"""Fused MoE experts in nf4 (engine.models.quantized_experts): held as bitsandbytes' codes, an expert's expansion is its
slice of bitsandbytes' own dequantization of the whole tensor, and the experts forward over them equals transformers'
eager experts over those dequantized weights used densely. Head-wise against stock over these models: the MoE rows
of tests/engine/test_quantized_parity.py."""

from __future__ import annotations

import copy

import bitsandbytes.functional as F
import pytest
import torch
from archs import tiny_configs
from quantized_models import config_of, quantized_pair
from transformers import BitsAndBytesConfig

from engine.models import quantized_experts
from engine.models.loader import describe
from engine.models.quantized import SCHEMES, quantization_config
from engine.models.quantized_experts import METHOD, expand, experts_weight_names, quantize_weight


def test_an_experts_expansion_is_its_slice_of_the_whole_tensors_dequantization():
    torch.manual_seed(0)
    original = torch.randn(6, 96, 128)
    weight = quantize_weight(original)
    assert type(weight).__name__ == "Params4bit" and weight.quant_state.shape == (6, 96, 128)
    assert weight.numel() == 6 * 96 * 128 // 2 and weight.quant_state.absmax.numel() == 6 * 96 * 128 // 64
    whole = F.dequantize_4bit(weight.data, weight.quant_state)  # [6, 96, 128]
    blocks = (whole - original).reshape(-1, 64).abs().amax(1) / original.reshape(-1, 64).abs().amax(1)
    assert blocks.max() < 0.16  # a lossy copy within nf4's widest gap (levels 0.72 and 1 of a block's absmax)
    for experts in ([4, 1], [0, 1, 2, 3, 4, 5], [5]):
        ids = torch.tensor(experts)
        assert torch.equal(expand(weight, ids), whole[ids])


def test_experts_whose_rows_leave_a_partial_block_stay_dense_and_expand_by_index():
    # bitsandbytes' CPU kernels do not round-trip rows of 32 in blocks of 64 (a tiny config's down_proj)
    dense = torch.randn(4, 64, 32)
    assert not quantized_experts.quantizable(dense) and quantized_experts.quantizable(torch.empty(4, 32, 64))
    assert torch.equal(expand(dense, torch.tensor([3, 0])), dense[[3, 0]])


@pytest.fixture(scope="module", params=["qwen3-moe", "gemma4-global-kv"])
def loaded(request, tmp_path_factory):
    return request.param, *quantized_pair(request.param, "bnb-nf4", tmp_path_factory.mktemp(request.param))


def test_the_loaded_experts_are_nf4_codes_and_the_model_runs_them(loaded):
    name, stock, model = loaded
    info = describe(model)
    assert info["weights"] == "bnb-nf4" and "lossy copy" in info["weights_label"]
    for each in (stock, model):
        assert each.config._experts_implementation == METHOD
        experts = [m for m in each.modules() if experts_weight_names(m)]
        assert len(experts) == each.config.num_hidden_layers
        for module in experts:
            for weight_name in experts_weight_names(module):
                weight = getattr(module, weight_name)
                assert type(weight).__name__ == "Params4bit" and weight.dtype == torch.uint8, (name, weight_name)
                assert len(weight.quant_state.shape) == 3


@torch.inference_mode()
def test_the_nf4_experts_equal_the_dequantized_weights_in_transformers_eager_experts(loaded, monkeypatch):
    name, _, model = loaded
    module = next(m for m in model.modules() if experts_weight_names(m))
    config = copy.deepcopy(model.config.get_text_config())
    config._experts_implementation = "eager"
    dense = type(module)(config)  # transformers' own experts, over bitsandbytes' dequantization of the codes
    for weight_name in experts_weight_names(module):
        weight = getattr(module, weight_name)
        setattr(dense, weight_name, torch.nn.Parameter(F.dequantize_4bit(weight.data, weight.quant_state)))
    torch.manual_seed(1)
    tokens, top_k = 24, 2
    hidden = torch.randn(tokens, config.hidden_size)
    index = torch.stack([torch.randperm(module.num_experts)[:top_k] for _ in range(tokens)])  # [tokens, top_k]
    weights = torch.softmax(torch.randn(tokens, top_k), dim=-1)
    ours = module(hidden, index, weights)
    assert torch.allclose(ours, dense(hidden, index, weights), rtol=1e-5, atol=1e-6), name
    monkeypatch.setattr(quantized_experts, "SCRATCH_BYTES", 1)  # one expert expanded at a time: the same sums
    assert torch.equal(module(hidden, index, weights), ours)
    one = module(hidden[:1], index[:1], weights[:1])  # a decode step: its own experts only
    assert torch.allclose(one, dense(hidden[:1], index[:1], weights[:1]), rtol=1e-5, atol=1e-6)


def test_only_a_model_with_fused_experts_loads_through_the_experts_quantizer():
    with torch.device("meta"):
        from transformers import AutoModelForCausalLM

        dense = AutoModelForCausalLM.from_config(config_of("qwen3"))
        moe = AutoModelForCausalLM.from_config(tiny_configs()["qwen3-moe"])
    scheme = SCHEMES["bnb-nf4"]
    assert type(quantization_config(scheme, torch.float32, "cpu", lambda: dense)) is BitsAndBytesConfig
    experts = quantization_config(scheme, torch.float32, "cuda", lambda: moe)
    assert experts.quant_method == METHOD and experts.load_in_4bit and experts.bnb_4bit_quant_type == "nf4"
    assert type(quantization_config(SCHEMES["bnb-int8"], torch.float32, "cpu", lambda: moe)) is BitsAndBytesConfig
