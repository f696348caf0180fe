"""int8 CPU weights (``load_model(weights="int8")``): the int8 model equals stock transformers running the very same
(dequantized) weights in its compute dtype (fp32, the default with a C compiler, or bf16), on every tiny family and
on the real SmolLM2; quantization is exact where it says so."""

from __future__ import annotations

import re

import pytest
import torch
from archs import _COMMON, reference_attention, tiny_configs
from parity import BF16_RTOL, RTOL, prompt, rel_diff, stepwise_logits
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, LlamaConfig

import engine
from engine.cpu import int8_matmul
from engine.cpu.int8 import Int8Embedding, Int8Linear, dequantized_state_dict, quantize_int8, quantize_rows
from engine.models.loader import WRAPPED_TEXT_TYPES, describe, load_model

#: compute dtype -> (load_model dtype, logits tolerance against stock on the same weights). The int8 kernel sums each
#: row in its own order, not MKL's: on a random tiny model that fp32 rounding grows layer by layer (1.08e-5 measured on
#: gemma4-global-kv's 512-wide global heads at decode step 4), so fp32 allows twice the dense parity's RTOL.
COMPUTE = {"fp32": ("float32", 2 * RTOL), "bf16": ("bfloat16", BF16_RTOL)}


def test_codes_times_scales_are_bf16_numbers_within_half_a_step():
    weight = torch.randn(300, 64) * torch.logspace(-4, 2, 300)[:, None]
    weight[7] = 0
    codes, scales = quantize_rows(weight)
    assert codes.dtype == torch.int8 and scales.dtype == torch.bfloat16 and codes.abs().max() <= 127
    exponents = torch.log2(scales.float())
    assert torch.equal(exponents, exponents.round()), "scales are powers of two"
    dense = codes.float() * scales.float()[:, None]
    assert torch.equal(dense, dense.to(torch.bfloat16).float()), "every weight is exactly a bf16 number"
    assert bool(((dense - weight).abs() <= scales.float()[:, None] / 2).all())
    assert scales[7] == 1 and not codes[7].any()
    # The smallest power of two that holds the row: half of it would overflow the codes.
    assert bool((weight.abs().amax(1) > 127 * scales.float() / 2)[torch.arange(300) != 7].all())


@pytest.mark.parametrize("rows", [1, 5, 45])
def test_int8_linear_is_the_dense_layer_of_its_dequantized_weight(rows):
    torch.manual_seed(0)
    dense = nn.Linear(64, 40, bias=True)
    codes, scales = quantize_rows(dense.weight.detach())
    layer = Int8Linear(codes, scales, dense.bias.detach().to(torch.bfloat16))
    x = torch.randn(2, rows, 64, dtype=torch.bfloat16)
    expected = nn.functional.linear(x, layer.dequantized(), layer.bias)
    actual = layer(x)
    assert actual.shape == (2, rows, 40) and actual.dtype == torch.bfloat16
    assert rel_diff(actual.float(), expected.float()) < 1e-2  # both sum in fp32; one bf16 rounding apart
    assert layer(x.float()).dtype == torch.float32  # an fp32 caller gets fp32 back


def _tied_llama() -> LlamaConfig:
    return LlamaConfig(**_COMMON, tie_word_embeddings=True)


def test_only_layers_the_kernel_can_run_are_replaced_and_a_tied_embedding_shares_the_codes():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_tied_llama())
    model.model.layers[0].mlp.down_proj = nn.Linear(12, 64, bias=False)  # an input width the kernel cannot read
    num_linear = sum(type(m) is nn.Linear for m in model.modules())
    assert quantize_int8(model) == num_linear - 1
    assert type(model.model.layers[0].mlp.down_proj) is nn.Linear
    assert model.model.layers[0].mlp.down_proj.weight.dtype == torch.bfloat16
    embeddings = model.get_input_embeddings()
    assert isinstance(embeddings, Int8Embedding) and embeddings.table is model.lm_head
    ids = torch.tensor([[3, 5, 96]])
    assert torch.equal(embeddings(ids), model.lm_head.dequantized()[ids])
    assert sum(isinstance(m, Int8Linear) for m in model.modules()) == num_linear - 1, "the lm_head is listed once"
    assert "model.embed_tokens.weight" in dequantized_state_dict(model)


def _as_named_by(stock, weights: dict) -> dict:
    """The int8 model's weights under stock's names: a published multimodal wrapper (Gemma 4's) keeps its text
    model under ``model.language_model.``, where the loader's text-only model has ``model.``."""
    names = set(stock.state_dict())
    return {name if name in names else re.sub(r"^model\.", "model.language_model.", name): weight
            for name, weight in weights.items()}


def _int8_pair(config, folder, attention: str, compute: str):
    """(stock model in the compute dtype running the int8 model's dequantized weights, int8 model via the real
    loader)."""
    torch.manual_seed(1234)
    auto = AutoModelForImageTextToText if config.model_type in WRAPPED_TEXT_TYPES else AutoModelForCausalLM
    auto.from_config(config).save_pretrained(folder)  # a multimodal wrapper is saved as published
    int8, _ = load_model(str(folder), device="cpu", dtype=COMPUTE[compute][0], with_tokenizer=False, weights="int8")
    dtype = torch.float32 if compute == "fp32" else torch.bfloat16
    stock = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=attention).eval()
    dequantized = _as_named_by(stock, dequantized_state_dict(int8))
    assert dequantized and set(dequantized) <= set(stock.state_dict())
    stock.load_state_dict(dequantized, strict=False)
    return stock, int8


#: bf16 compute (asked for, or no C compiler) on families that cover its kernel's cases: GQA, a tied table,
#: softcap, sliding windows, MoE, a hybrid; every family runs the default fp32 compute.
BF16_FAMILIES = ("llama-gqa", "llama-tied", "gemma2-softcap", "qwen2-window", "qwen3-moe", "lfm2-hybrid")


@pytest.fixture(scope="module", params=[(name, "fp32") for name in sorted(tiny_configs()) + ["llama-tied"]]
                + [(name, "bf16") for name in BF16_FAMILIES],
                ids=lambda param: f"{param[0]}-{param[1]}")
def int8_pair(request, tmp_path_factory):
    name, compute = request.param
    config = _tied_llama() if name == "llama-tied" else tiny_configs()[name]
    stock, int8 = _int8_pair(config, tmp_path_factory.mktemp(f"{name}-int8-{compute}"), reference_attention(name),
                             compute)
    return f"{name}-{compute}", stock, int8


@torch.inference_mode()
def test_int8_weights_match_stock_running_the_same_weights(int8_pair):
    """Prefill and decode logits within float (fp32) or bf16 rounding of stock's, and the same greedy tokens (bf16:
    up to a tie within bf16 rounding)."""
    name, stock, int8 = int8_pair
    compute = name.rsplit("-", 1)[1]
    assert any(isinstance(m, Int8Linear) for m in int8.modules()), name
    assert describe(int8)["weights"] == "int8"
    assert describe(int8)["dtype"] == {"fp32": "float32", "bf16": "bfloat16"}[compute]
    ids = prompt(stock.config.get_text_config().vocab_size)
    actual, expected = stepwise_logits(stock, int8, ids)
    for step, (a, e) in enumerate(zip(actual, expected)):
        assert rel_diff(a.float(), e.float()) < COMPUTE[compute][1], (name, step)
    kwargs = dict(max_new_tokens=20, do_sample=False, min_new_tokens=20, output_logits=True,
                  return_dict_in_generate=True)
    generated = int8.generate(ids, past_key_values=engine.HeadInferCache(int8.config, resident_slots=0), **kwargs)
    reference = stock.generate(ids, **kwargs)
    if compute == "fp32":
        assert torch.equal(generated.sequences, reference.sequences), name
    else:
        agreeing_steps(generated.sequences, reference, ids.shape[1], name)


def agreeing_steps(sequences: torch.Tensor, reference, prompt_len: int, name: str) -> int:
    """The greedy steps before the first token that differs from stock's; a difference is allowed only at a tie of
    stock's two best logits within bf16 rounding (stock's own bf16 kernels and ours order sums differently: the dense
    bf16 path meets the same ties, e.g. SmolLM2 on the 1,024-token prompt below at step 9)."""
    differs = (sequences != reference.sequences)[0, prompt_len:]
    if not differs.any():
        return len(differs)
    step = int(differs.nonzero()[0])
    assert top_two_gap(reference.logits[step]) < BF16_RTOL, f"{name}: greedy tokens differ at step {step}"
    return step


def top_two_gap(logits: torch.Tensor) -> float:
    """How far stock's best logit leads the second, relative to the largest: below bf16 rounding it is a tie, where
    either token is the greedy one within bf16."""
    top = logits[0].float().topk(2).values
    return float((top[0] - top[1]) / logits.float().abs().max())


def test_int8_is_refused_off_the_cpu_and_outside_fp32_and_bf16(tmp_path):
    AutoModelForCausalLM.from_config(tiny_configs()["llama-gqa"]).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        load_model(str(tmp_path), device="cpu", dtype="float16", with_tokenizer=False, weights="int8")
    with pytest.raises(ValueError, match="weights mode"):
        load_model(str(tmp_path), device="cpu", with_tokenizer=False, weights="int4")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            load_model(str(tmp_path), device="cuda", with_tokenizer=False, weights="int8")


def test_int8_computes_in_fp32_by_default_where_the_gemv_builds(tmp_path):
    AutoModelForCausalLM.from_config(tiny_configs()["llama-gqa"]).save_pretrained(tmp_path)
    model, _ = load_model(str(tmp_path), device="cpu", with_tokenizer=False, weights="int8")
    expected = "float32" if int8_matmul.kernel() is not None else "bfloat16"
    assert describe(model)["dtype"] == expected
    assert {m.scales.dtype for m in model.modules() if isinstance(m, Int8Linear)} == {next(model.parameters()).dtype}


@pytest.mark.slow
@pytest.mark.parametrize("compute", sorted(COMPUTE))
@torch.inference_mode()
def test_real_smollm2_int8_matches_stock_on_the_same_weights(smollm2_dir, compute):
    from smollm2_runs import real_text

    load_dtype, tolerance = COMPUTE[compute]
    int8, tokenizer = load_model(str(smollm2_dir), device="cpu", dtype=load_dtype, weights="int8")
    dtype = torch.float32 if compute == "fp32" else torch.bfloat16
    stock = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=dtype, attn_implementation="sdpa").eval()
    stock.load_state_dict(dequantized_state_dict(int8), strict=False)
    ids = torch.tensor([tokenizer(real_text(), add_special_tokens=False)["input_ids"][:1024]])
    kwargs = dict(max_new_tokens=24, do_sample=False, output_logits=True, return_dict_in_generate=True)
    expected = stock.generate(ids, **kwargs)
    cache = engine.HeadInferCache(int8.config, resident_slots=0, chunk_size=256)
    actual = int8.generate(ids, past_key_values=cache, prefill_chunk_size=256, **kwargs)
    if compute == "fp32":  # float rounding apart: every token
        steps = 24
        assert torch.equal(actual.sequences, expected.sequences)
    else:
        steps = agreeing_steps(actual.sequences, expected, ids.shape[1], "smollm2")
        assert steps >= 8, steps  # a tie this early would leave little compared: pick another prompt
        # Over 24 bf16 steps the engine's own bf16 attention drifts from stock's by up to ~2.2e-2 on some CPUs
        # (an AVX-512 Xeon: the dense bf16 engine on these very weights, no int8 involved): the int8 layers may
        # add no more than a quarter of that.
        dense, _ = load_model(str(smollm2_dir), device="cpu", dtype=load_dtype, weights="dense")
        dense.load_state_dict(dequantized_state_dict(int8), strict=False)
        own = dense.generate(ids, past_key_values=engine.HeadInferCache(dense.config, resident_slots=0,
                                                                        chunk_size=256),
                             prefill_chunk_size=256, **kwargs)
        drift = max(rel_diff(a.float(), e.float()) for a, e in zip(own.logits[:steps], expected.logits[:steps]))
        tolerance = max(tolerance, 1.25 * drift)
    for step, (a, e) in enumerate(zip(actual.logits[:steps], expected.logits[:steps])):
        assert rel_diff(a.float(), e.float()) < (10 * tolerance if compute == "fp32" else tolerance), step
    short = tokenizer("The capital of France is Paris. The capital of Germany is", return_tensors="pt").input_ids
    actual = int8.generate(short, past_key_values=engine.HeadInferCache(int8.config), **kwargs)
    assert torch.equal(actual.sequences, stock.generate(short, **kwargs).sequences)  # no tie here: every token


@pytest.mark.slow
def test_launch_with_int8_bf16_weights_answers_a_question(tmp_path):
    """``launch.py --weights int8 --dtype bfloat16`` as a user starts it (embedded SmolLM2): a document read and one
    question answered by the served process, which is still alive afterwards (torch's int8 kernel killed it on an
    AVX-512 Xeon before its probe)."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request
    from pathlib import Path

    from gradio_client import Client, handle_file

    root = Path(__file__).resolve().parents[3]
    from make_files import make_pdf

    pdf = make_pdf(tmp_path / "lighthouse.pdf", ("The lighthouse keeper is called Mara.",
                                                 "The secret launch code of the lighthouse is AMBER-7."))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path / "launch.log"
    with log.open("w") as sink:
        process = subprocess.Popen([sys.executable, "launch.py", "--port", str(port), "--no-kv-cache", "--weights",
                                    "int8", "--dtype", "bfloat16"], cwd=root, stdout=sink, stderr=subprocess.STDOUT)
    try:
        url, deadline = f"http://127.0.0.1:{port}/", time.monotonic() + 600
        while True:
            assert process.poll() is None, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(url, timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(1)
        client = Client(url, verbose=False)
        client.predict([handle_file(str(pdf))], api_name="/upload")
        client.submit(False, api_name="/read").result(timeout=600)
        chat, *_ = client.predict("What is the secret launch code?", [], 16, 0.0, api_name="/ask")
        client.close()
        assert process.poll() is None, log.read_text()[-3000:]
        assert chat[-1]["role"] == "assistant" and "tok/s" in str(chat[-1]["content"]), chat  # a finished answer
    finally:
        process.terminate()
        process.wait(timeout=60)
