"""The prefill's fp32 matmul on the CPU (``engine.cpu.cpu_matmul``): oneDNN's product where it runs, ``F.linear``
everywhere else, both the same fp32 product to rounding, and a model reads the same through either."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gguf_samples import needs_kernel
from parity import RTOL, rel_diff
from probe_records import died_of_abort

import engine
from engine.cpu import cpu_matmul
from engine.models.loader import _embedded_gguf, load_model

needs_onednn = pytest.mark.skipif(not cpu_matmul.available(), reason="this torch has no oneDNN linear")


@pytest.fixture(scope="module")
def smollm2_blocks():
    """The embedded SmolLM2 Q4_1 GGUF on its own blocks (the CPU default for GGUF models)."""
    return load_model(str(_embedded_gguf()), device="cpu", weights="gguf")


@pytest.fixture(autouse=True)
def machine_choice():
    yield
    cpu_matmul.force(None)


def _scaled_error(actual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias) -> float:
    """The largest difference from the float64 product, relative to the sum of the terms' magnitudes (what fp32
    rounding scales with)."""
    expected = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    scale = (x.double().abs() @ weight.double().abs().T).clamp_min(1e-6)
    return float(((actual.double() - expected).abs() / scale).max())


@needs_onednn
@pytest.mark.parametrize("shape", [(512, 256, 160), (1, 37, 96, 80), (2, 33, 64, 8), (17, 1536, 256)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_onednn_gives_the_fp32_product(shape, with_bias, monkeypatch):
    *rows, inputs, outputs = shape
    x, weight = torch.randn(*rows, inputs), torch.randn(outputs, inputs)
    bias = torch.randn(outputs) if with_bias else None

    def not_mkl(*args, **kwargs):
        raise AssertionError("F.linear ran where oneDNN was forced")

    cpu_matmul.force(True)
    monkeypatch.setattr(cpu_matmul.F, "linear", not_mkl)
    actual = cpu_matmul.linear(x, weight, bias)
    assert actual.shape == (*rows, outputs) and actual.dtype == torch.float32
    assert _scaled_error(actual, x, weight, bias) < 1e-6


@needs_onednn
def test_onednn_reads_a_transposed_input_as_its_values():
    x = torch.randn(96, 40).T  # [40, 96], not contiguous
    weight = torch.randn(24, 96)
    cpu_matmul.force(True)
    assert _scaled_error(cpu_matmul.linear(x, weight), x, weight, None) < 1e-6


def test_the_fallback_is_f_linear_bit_for_bit(monkeypatch):
    x, weight, bias = torch.randn(40, 64), torch.randn(24, 64), torch.randn(24)
    cpu_matmul.force(False)
    monkeypatch.setattr(cpu_matmul, "_onednn", lambda *args: pytest.fail("oneDNN ran where F.linear was forced"))
    assert torch.equal(cpu_matmul.linear(x, weight, bias), F.linear(x, weight, bias))


@needs_onednn
@pytest.mark.parametrize("case", ["reduced precision", "bf16", "autograd"])
def test_only_a_full_precision_fp32_product_goes_to_onednn(case, monkeypatch):
    cpu_matmul.force(True)
    monkeypatch.setattr(cpu_matmul, "_onednn", lambda *args: pytest.fail("oneDNN ran"))
    x, weight = torch.randn(20, 64), torch.randn(24, 64)
    if case == "autograd":  # oneDNN's op has no backward: a product that may be differentiated stays F.linear's
        weight.requires_grad_(True)
        assert torch.equal(cpu_matmul.linear(x, weight), F.linear(x, weight))
        return
    if case == "bf16":
        x, weight = x.bfloat16(), weight.bfloat16()
        assert torch.equal(cpu_matmul.linear(x, weight), F.linear(x, weight))
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")  # oneDNN could then round to bf16; F.linear keeps its own rule
    try:
        assert torch.equal(cpu_matmul.linear(x, weight), F.linear(x, weight))
    finally:
        torch.set_float32_matmul_precision(before)


@needs_onednn
def test_a_probe_that_crashes_costs_a_child_and_products_take_f_linear(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADINFER_CACHE", str(tmp_path))  # no probe answer remembered
    monkeypatch.setattr(cpu_matmul, "PROBE", "os:abort")  # a child that dies as an illegal instruction would
    monkeypatch.setattr(cpu_matmul, "_onednn", lambda *args: pytest.fail("oneDNN ran though its probe crashed"))
    cpu_matmul._onednn_is_safe.cache_clear()
    try:
        assert cpu_matmul.uses_onednn() is False  # and this process is still here to say so
        assert died_of_abort(tmp_path, "torch-onednn-linear")
        x, weight = torch.randn(20, 64), torch.randn(24, 64)
        assert torch.equal(cpu_matmul.linear(x, weight), F.linear(x, weight))
    finally:
        cpu_matmul._onednn_is_safe.cache_clear()


@needs_onednn
def test_the_probe_itself_passes_on_this_machine():
    cpu_matmul.exercise_onednn()  # raises SystemExit on a wrong product


@needs_kernel
@needs_onednn
@torch.inference_mode()
def test_the_real_gguf_model_reads_and_answers_the_same_through_either_product(smollm2_blocks):
    """The embedded SmolLM2 GGUF on its blocks: 768 tokens read in 256-token chunks (the dequantize-and-matmul
    path), then greedy steps; the logits within the parity tolerance and identical tokens, oneDNN against F.linear.
    (Random tiny models amplify fp32 rounding layer by layer far more than a trained one: up to 2e-4 there.)"""
    from smollm2_runs import real_text

    model, tokenizer = smollm2_blocks
    ids = torch.tensor([tokenizer(real_text(), add_special_tokens=False)["input_ids"][:768]])
    runs = []
    for onednn in (True, False):
        cpu_matmul.force(onednn)
        cache = engine.HeadInferCache(model.config, chunk_size=256)
        logits = [model(ids[:, b : b + 256], past_key_values=cache, use_cache=True).logits[0] for b in (0, 256, 512)]
        tokens = []
        for _ in range(8):
            tokens.append(int(logits[-1][-1].argmax()))
            logits.append(model(torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True).logits[0])
        runs.append((torch.cat(logits), tokens))
    (with_onednn, tokens_onednn), (with_mkl, tokens_mkl) = runs
    assert tokens_onednn == tokens_mkl
    assert rel_diff(with_onednn, with_mkl) < RTOL


def test_loading_cpu_block_weights_runs_the_probe_at_load_not_in_the_first_read(monkeypatch, tmp_path):
    from transformers import LlamaConfig

    from engine.models import loader

    LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=97).save_pretrained(tmp_path)  # dense loading reads the config

    asked = []
    monkeypatch.setattr(cpu_matmul, "uses_onednn", lambda: asked.append(1) or True)
    assert loader._weights_and_dtype("m", "m.gguf", "cpu", "auto", torch.float32, "gguf") == ("gguf", torch.float32)
    assert asked == [1]
    loader._weights_and_dtype("m", "m.gguf", "cpu", "auto", torch.float32, "dense")
    loader._weights_and_dtype(str(tmp_path), None, "cpu", "bfloat16", torch.bfloat16, "dense")
    assert asked == [1]  # dense weights multiply in torch's own linear layers: nothing of ours to probe
