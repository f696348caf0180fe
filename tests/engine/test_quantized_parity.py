"""Exactness over quantized weights: a model quantized by torchao or bitsandbytes through transformers' quantizer
(``load_model(weights=...)``, ``engine.models.quantized``) with head-wise attention equals stock attention (sdpa /
eager, no HeadInferCache) over the *same* quantized model: identical quantized tensors, logits within float
tolerance, identical greedy tokens. Every scheme whose library computes on the CPU, on families that cover GQA,
per-head norms, a hybrid, sliding windows and fused MoE experts (nf4 in ``bnb-nf4``: engine.models.quantized_experts;
dense in the 8-bit schemes)."""

from __future__ import annotations

import logging

import pytest
import torch
from parity import RTOL, prompt, rel_diff, stepwise_logits
from quantized_models import quantized_pair

import engine
from engine.models.loader import describe, load_model
from engine.models.quantized import (
    SCHEMES,
    fused_experts_params,
    held_weight_bytes,
    installed,
    kept_dense_params,
)
from engine.planning.budgets import held_bytes, num_weights

#: schemes with a CPU path whose library is installed here; ``torchao-int4`` needs CUDA (tinygemm)
CPU_SCHEMES = [name for name, scheme in SCHEMES.items() if "cpu" in scheme.devices and installed(scheme.library)]
FAMILIES = ("llama-gqa", "qwen3", "qwen3.5-hybrid", "gemma3-window")
#: fused experts: Qwen3-MoE, Qwen3.5-MoE (hybrid, shared expert; its text model), Gemma 4's MoE block beside the MLP
MOE_FAMILIES = ("qwen3-moe", "qwen3.5-moe", "gemma4-global-kv")


def _inner(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The tensors a quantized weight holds: a torchao tensor's inner tensors, a bitsandbytes parameter's codes
    and scales, or the tensor itself."""
    if hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        return [t for name in names for t in _inner(getattr(tensor, name)) if t is not None]
    state = getattr(tensor, "quant_state", None)
    extra = [getattr(tensor, "SCB", None)] + ([state.absmax] if state is not None else [])
    return [tensor.data] + [t for t in extra if isinstance(t, torch.Tensor)]


@pytest.fixture(scope="module", params=[(n, s) for s in CPU_SCHEMES for n in FAMILIES + MOE_FAMILIES], ids="-".join)
def pair(request, tmp_path_factory):
    name, scheme = request.param
    stock, model = quantized_pair(name, scheme, tmp_path_factory.mktemp(f"{name}-{scheme}"))
    if name in MOE_FAMILIES:
        # bitsandbytes' packed CPU nf4 kernel (AVX512-BF16) rounds a layer's inputs to bf16: a 1e-7 difference between
        # the two attentions that crosses a step moves the MoE models' logits by 1e-3. Its fp32 path (the expansion
        # a GPU computes with) leaves the attention's difference alone.
        for module in (*stock.modules(), *model.modules()):
            if hasattr(module, "support_avx512bf16_for_cpu"):
                module.support_avx512bf16_for_cpu = False
    return name, scheme, stock, model


def test_the_cpu_schemes_are_the_libraries_cpu_paths():
    # What this file proves depends on what is installed: bitsandbytes always (requirements.txt); torchao's schemes
    # where `pip install torchao==0.18.0` added it (not in CI: installed, every transformers import loads it).
    expected = {"bnb-int8", "bnb-nf4"} | ({"torchao-int8", "torchao-fp8"} if installed("torchao") else set())
    assert set(CPU_SCHEMES) == expected


def test_both_hold_the_same_quantized_weights(pair):
    name, scheme, stock, model = pair
    info = describe(model)
    assert info["weights"] == scheme and "lossy copy of the bf16 weights" in info["weights_label"]
    ours, theirs = dict(model.named_parameters()), dict(stock.named_parameters())
    assert ours.keys() == theirs.keys()
    quantized = [key for key, p in ours.items() if type(p) not in (torch.Tensor, torch.nn.Parameter)]
    assert len(quantized) >= 3 * 4, quantized  # every layer's projections at least
    for key in ours:
        assert all(torch.equal(a, b) for a, b in zip(_inner(ours[key]), _inner(theirs[key]), strict=True)), key
    # The planner's counts see through the libraries' tensors: all the weights, at their quantized bytes.
    dense, _ = load_model(str(model.config.name_or_path), device="cpu", dtype="float32", with_tokenizer=False,
                          weights="dense")
    assert num_weights(model) == num_weights(dense)
    # What the planner and the picker assume a mode holds (engine.models.quantized): within the tiny rows' scales
    # (a 4-byte scale a 64-weight row is 6% here, 0.1% on a real model's rows) and norms.
    experts = fused_experts_params(model.config)
    narrow = sum(m.weight.numel() for key, m in model.named_modules()  # too narrow for the CPU kernel: dense
                 if type(m) is torch.nn.Linear and key != "lm_head")
    expected = held_weight_bytes(scheme, num_weights(dense), kept_dense_params(model.config) + narrow,
                                 experts=experts, device="cpu", dtype_bytes=4)
    assert abs(held_bytes(model) - expected) < 0.15 * expected, (held_bytes(model), expected)
    if SCHEMES[scheme].experts or not experts:  # (the 8-bit schemes hold the experts, most of a tiny MoE, dense)
        assert held_bytes(model) < (0.3 if SCHEMES[scheme].bits == 4 else 0.4) * held_bytes(dense)


@torch.inference_mode()
def test_head_wise_logits_match_stock_over_the_same_quantized_weights(pair):
    name, scheme, stock, model = pair
    ids = prompt(stock.config.vocab_size)
    actual, expected = stepwise_logits(stock, model, ids)
    for step, (a, e) in enumerate(zip(actual, expected)):
        assert rel_diff(a, e) < (SCHEMES[scheme].parity_rtol or RTOL), (name, scheme, step)


@torch.inference_mode()
def test_greedy_tokens_identical_over_the_same_quantized_weights(pair):
    name, scheme, stock, model = pair
    ids = prompt(stock.config.vocab_size)
    kwargs = dict(max_new_tokens=20, do_sample=False, min_new_tokens=20)
    expected = stock.generate(ids, **kwargs)
    actual = model.generate(ids, past_key_values=engine.HeadInferCache(model.config, resident_slots=0),
                            prefill_chunk_size=16, **kwargs)
    assert torch.equal(actual, expected), (name, scheme)


def test_the_self_check_of_a_quantized_model_runs_tiny_models_quantized_alike(tmp_path):
    from engine import OffloadPolicy
    from engine.selfcheck import report as selfcheck
    from engine.selfcheck.cases import TinyPair

    pair = TinyPair.build("gemma3-window", torch.float32, torch.device("cpu"), SCHEMES["bnb-nf4"])
    assert [type(p).__name__ for p in (pair.stock.model.layers[0].mlp.up_proj.weight,
                                       pair.headinfer.model.layers[0].mlp.up_proj.weight)] == ["Params4bit"] * 2
    assert torch.equal(pair.stock.model.layers[0].mlp.up_proj.weight, pair.headinfer.model.layers[0].mlp.up_proj.weight)
    policy = OffloadPolicy(host_attention="auto")
    report = selfcheck.run_self_check(policy, "cpu", folder=tmp_path, archs=("llama-gqa",), weights="4bit")
    assert report.identity["weights"] == "bnb-nf4" and report.passed, report.cases
    assert {case.feature for case in report.cases} == {"overlap", "host_attention"}
    assert all(case.tokens_equal and case.max_rel_error < RTOL for case in report.cases), report.cases
    assert selfcheck.cached_report(policy, "cpu", tmp_path, weights="bnb-nf4") == report
    assert selfcheck.cached_report(policy, "cpu", tmp_path) is None  # dense weights: another report


@torch.inference_mode()
def test_a_checkpoint_published_quantized_loads_as_it_is(tmp_path):
    from engine.errors import InputError

    stock, quantized = quantized_pair("qwen3", "bnb-nf4", tmp_path / "source")
    quantized.save_pretrained(tmp_path / "published")  # a folder whose config.json has a quantization_config
    model, _ = load_model(str(tmp_path / "published"), device="cpu", dtype="float32", with_tokenizer=False)
    info = describe(model)
    assert info["weights"] == "prequantized:bitsandbytes" and "published" in info["weights_label"]
    weight = model.model.layers[0].mlp.up_proj.weight
    assert type(weight).__name__ == "Params4bit"
    assert torch.equal(weight, stock.model.layers[0].mlp.up_proj.weight)  # the codes as saved
    ids = prompt(stock.config.vocab_size)
    actual, expected = stepwise_logits(stock, model, ids)
    assert max(rel_diff(a, e) for a, e in zip(actual, expected)) < RTOL
    with pytest.raises(InputError, match="published quantized"):
        load_model(str(tmp_path / "published"), device="cpu", weights="8bit", with_tokenizer=False)


@torch.inference_mode()
def test_the_int8_matmuls_cast_warning_is_logged_once_not_per_layer_and_token(tmp_path, caplog):
    _, model = quantized_pair("llama-gqa", "bnb-int8", tmp_path)
    with caplog.at_level(logging.WARNING, logger="bitsandbytes"):
        for _ in range(3):
            model(torch.tensor([[1, 2, 3]]))
    assert sum("will be cast" in r.getMessage() for r in caplog.records) <= 1  # was 7 layers x 3 layers x 3 calls
