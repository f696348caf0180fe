"""A GGUF file's own blocks as CPU weights (``weights="gguf"``, engine.models.gguf_blocks): exactly the weights
stock transformers dequantizes from the file, multiplied in fp32."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from transformers import AutoModelForCausalLM

import engine
from engine.models import gguf_blocks
from engine.models.gguf_blocks import BlockEmbedding, BlockLinear, block_linear, dequantize, dequantize_torch
from engine.models.int8 import num_weights
from engine.models.loader import _embedded_gguf, _weights_cache_entry, converted_gguf_dir, load_model
from engine.store.fingerprint import weights_mode
from test_parity import RTOL, rel_diff

TYPES = {"Q4_0": GGMLQuantizationType.Q4_0, "Q4_1": GGMLQuantizationType.Q4_1, "Q8_0": GGMLQuantizationType.Q8_0}
needs_kernel = pytest.mark.skipif(gguf_blocks.kernel() is None, reason="no C compiler here")


def blocks_of(weight: np.ndarray, kind: str) -> torch.Tensor:
    """gguf-py's own quantization of ``weight`` [out, in]: the bytes a GGUF file holds."""
    return torch.from_numpy(gguf_quantize(weight.astype(np.float32), TYPES[kind]))


def random_weight(out_features: int, in_features: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((out_features, in_features)).astype(np.float32) * 0.05
    weight[-1, :32] += 3.0  # a block with an offset (Q4_1's m far from 0)
    weight[0] = 0.0  # a row of zeros: d = 0
    return weight


@pytest.mark.parametrize("kind", sorted(TYPES))
def test_dequantize_is_gguf_py_bit_for_bit(kind):
    raw = blocks_of(random_weight(37, 96), kind)
    expected = torch.from_numpy(gguf_dequantize(raw.numpy(), TYPES[kind]).astype(np.float32))
    assert torch.equal(dequantize_torch(raw, TYPES[kind], 96), expected)
    assert torch.equal(dequantize(raw, TYPES[kind], 96), expected)  # C where built, else the same torch ops


@needs_kernel
@pytest.mark.parametrize("kind", sorted(TYPES))
@pytest.mark.parametrize("rows", [1, 3, 16, 17, 40])
@pytest.mark.parametrize("out_features", [1, 6, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_block_linear_is_the_dequantized_matmul(kind, rows, out_features, with_bias):
    in_features = 160
    raw = blocks_of(random_weight(out_features, in_features, seed=rows), kind)
    weight = dequantize_torch(raw, TYPES[kind], in_features)
    x = torch.randn(rows, in_features)
    bias = torch.randn(out_features) if with_bias else None
    actual = block_linear(x, raw, TYPES[kind], bias)
    if rows > gguf_blocks.GEMV_ROWS:  # prefill chunks: torch's matmul of exactly those weights
        assert torch.equal(actual, F.linear(x, weight, bias))
    else:  # decode rows: the C GEMV, same products in another grouping
        expected = x.double() @ weight.double().T + (0 if bias is None else bias.double())
        scale = (x.double().abs() @ weight.double().abs().T).clamp_min(1e-6)
        assert ((actual.double() - expected).abs() / scale).max() < 1e-5


@needs_kernel
def test_block_linear_split_over_workers_equals_one_thread():
    raw = blocks_of(random_weight(4100, 512, seed=3), "Q4_1")  # 4100 rows x 320 bytes: more than 2 MiB
    x = torch.randn(2, 512)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = block_linear(x, raw, TYPES["Q4_1"], None)
        torch.set_num_threads(3)
        split = block_linear(x, raw, TYPES["Q4_1"], None)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, split)  # each output row is summed by one thread, whichever


def test_rows_are_matched_through_a_permutation_and_refused_otherwise():
    raw = blocks_of(random_weight(64, 64, seed=5), "Q4_1")
    weight = dequantize_torch(raw, TYPES["Q4_1"], 64)
    order = torch.randperm(64)
    matched = gguf_blocks._rows_matching(weight[order], raw.numpy(), TYPES["Q4_1"])
    assert matched is not None and torch.equal(dequantize_torch(matched, TYPES["Q4_1"], 64), weight[order])
    other = weight.clone()
    other[7, 3] = torch.nextafter(other[7, 3], torch.tensor(1.0))  # one weight one ulp off: not these blocks
    assert gguf_blocks._rows_matching(other, raw.numpy(), TYPES["Q4_1"]) is None


def test_block_embedding_rows_are_the_tables():
    raw = blocks_of(random_weight(50, 64, seed=7), "Q8_0")
    table = BlockLinear(raw, TYPES["Q8_0"], 64, None)
    embedding = BlockEmbedding(table, padding_idx=None)
    ids = torch.tensor([[3, 0, 49], [7, 7, 1]])
    assert torch.equal(embedding(ids), F.embedding(ids, dequantize_torch(raw, TYPES["Q8_0"], 64)))


def test_gguf_weights_need_a_gguf_source_and_fp32(tmp_path):
    AutoModelForCausalLM.from_config(_tiny_llama()).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="not a GGUF model"):
        load_model(str(tmp_path), device="cpu", with_tokenizer=False, weights="gguf")
    with pytest.raises(ValueError, match="compute in float32"):
        load_model(None, device="cpu", dtype="bfloat16", weights="gguf")


def _tiny_llama():
    from archs import tiny_configs

    return tiny_configs()["llama-gqa"]


@pytest.mark.slow
@needs_kernel
@torch.inference_mode()
def test_real_smollm2_gguf_blocks_match_stock_loading_the_same_file(smollm2_dir):
    """Every linear layer of the embedded Q4_1 GGUF keeps its blocks; the model answers as stock transformers does
    with the file dequantized (the converted folder), token for token, and a cached reload is bit-identical."""
    from test_smollm2 import real_text

    gguf = _embedded_gguf()
    entry = _weights_cache_entry(str(converted_gguf_dir(gguf)), False, "cpu", torch.float32, "gguf")
    shutil.rmtree(entry.folder, ignore_errors=True)  # the first load matches the blocks and saves them
    model, tokenizer = load_model(str(gguf), device="cpu", weights="gguf")
    assert entry.folder.is_dir()
    layers = [m for m in model.modules() if isinstance(m, BlockLinear)]
    reader_types = {int(t.tensor_type) for t in GGUFReader(str(gguf)).tensors if len(t.shape) == 2}
    assert len(layers) == 211 and {m.qtype for m in layers} == reader_types  # 210 Q4_1 + the tied Q8_0 lm_head
    assert isinstance(model.get_input_embeddings(), BlockEmbedding) and weights_mode(model) == "gguf"
    stock = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    assert num_weights(model) == num_weights(stock)
    ids = torch.tensor([tokenizer(real_text(), add_special_tokens=False)["input_ids"][:1024]])
    kwargs = dict(max_new_tokens=24, do_sample=False, output_logits=True, return_dict_in_generate=True)
    expected = stock.generate(ids, **kwargs)
    cache = engine.HeadInferCache(model.config, resident_slots=0, chunk_size=256)
    actual = model.generate(ids, past_key_values=cache, prefill_chunk_size=256, **kwargs)
    assert torch.equal(actual.sequences, expected.sequences)
    for step, (a, e) in enumerate(zip(actual.logits, expected.logits)):
        assert rel_diff(a, e) < 10 * RTOL, step
    short = tokenizer("The capital of France is Paris. The capital of Germany is", return_tensors="pt").input_ids
    first = model.generate(short, past_key_values=engine.HeadInferCache(model.config), **kwargs)
    assert torch.equal(first.sequences, stock.generate(short, **kwargs).sequences)
    cached, _ = load_model(str(gguf), device="cpu", weights="gguf", with_tokenizer=False)
    assert gguf_blocks.block_layout(cached) == gguf_blocks.block_layout(model)
    again = cached.generate(short, past_key_values=engine.HeadInferCache(cached.config), **kwargs)
    assert torch.equal(again.sequences, first.sequences)
    assert all(torch.equal(a, b) for a, b in zip(again.logits, first.logits))
