"""A GGUF file's blocks held as they are and expanded with torch per layer (``weights="gguf"`` off the CPU,
engine.models.gguf_device), tested on the CPU with the torch path forced (``HEADINFER_GGUF_TORCH=1``): the
expansion is gguf-py's dequantization bit for bit, the model is the dense load of the same file, head-wise
attention over it is stock attention's, and it holds the file's bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf_files import LLAMA_8B_SHAPE, SHAPE_27B, header_only_gguf, k_quant_blocks, write_tiny_gguf
from gguf_samples import SMALL, TYPES, blocks_of, random_blocks, random_weight
from parity import RTOL, rel_diff
from transformers import LlamaConfig

import engine
from engine.cpu.gguf_blocks import BLOCK_TYPES, BlockLinear, random_block_rows
from engine.cpu.gguf_blocks import dequantize_reference as reference
from engine.models import gguf_device
from engine.models.gguf_device import ExpandingEmbedding, ExpandingLinear, expand, gguf_device_bytes
from engine.models.gguf_header import read_header
from engine.models.loader import _weights_and_dtype, load_model
from engine.models.weights_mode import weights_mode
from engine.planning.budgets import held_bytes, num_weights


@pytest.mark.parametrize("kind", sorted(TYPES))
def test_the_expansion_is_gguf_pys_dequantization_bit_for_bit(kind):
    raw = random_blocks(37, 512, kind)  # every bit pattern of scales, mins, high bits and codes
    assert torch.equal(expand(raw, TYPES[kind]), reference(raw, TYPES[kind]))
    # in the compute dtype: the fp32 weight rounded once, what a dense bf16 / fp16 load of the file holds
    for dtype in (torch.bfloat16, torch.float16):
        assert torch.equal(expand(raw, TYPES[kind], dtype), reference(raw, TYPES[kind]).to(dtype))
    if kind in SMALL:  # and on blocks gguf-py made from weights (a zero row, an offset block)
        raw = blocks_of(random_weight(37, 96), kind)
        assert torch.equal(expand(raw, TYPES[kind]), reference(raw, TYPES[kind]))


def test_a_large_layer_expands_a_slice_of_rows_at_a_time(monkeypatch):
    raw = random_blocks(70, 256, "Q6_K", seed=3)
    weight, x, bias = reference(raw, TYPES["Q6_K"]), torch.randn(2, 5, 256), torch.randn(70)
    layer = ExpandingLinear(raw, TYPES["Q6_K"], 256, bias)
    monkeypatch.setattr(gguf_device, "SLICE_BYTES", 16 * 4 * 256)  # 16 rows a slice: 5 slices
    built = []
    real = gguf_device.expand
    monkeypatch.setattr(gguf_device, "expand", lambda r, q, d=torch.float32: built.append(r.shape[0]) or real(r, q, d))
    y = layer(x)
    assert built == [16, 16, 16, 16, 6] and y.shape == (2, 5, 70)
    scale = x.abs() @ weight.abs().T + bias.abs()  # another matmul shape may sum in another order
    assert ((y - F.linear(x, weight, bias)).abs() / scale).max() < 1e-6


def _models(tmp_path, monkeypatch, key: str):
    """(the GGUF, its dense fp32 load, its torch-expansion load with head-wise attention, the same with sdpa)."""
    from archs import tiny_configs

    if key == "llama-every-type":  # 256 wide: the K types' super-blocks; Llama's q/k rows permuted in the file
        config, architecture, blocks = LlamaConfig(
            vocab_size=300, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False), "llama", k_quant_blocks()
    else:  # Q8_0 throughout, 64 wide
        config, architecture, blocks = tiny_configs()[key], "llama", None
    gguf = tmp_path / f"{key}.gguf"
    write_tiny_gguf(gguf, architecture, config, blocks=blocks, with_tokenizer=True)
    dense, _ = load_model(str(gguf), device="cpu", weights="dense", with_tokenizer=False)
    monkeypatch.setenv(gguf_device.FORCE_ENV, "1")
    expanding, _ = load_model(str(gguf), device="cpu", weights="gguf", with_tokenizer=False)
    stock, _ = load_model(str(gguf), device="cpu", weights="gguf", with_tokenizer=False, attn_implementation="sdpa")
    return gguf, dense, expanding, stock


@pytest.mark.parametrize("key", ["llama-every-type", "llama-mqa"])
@torch.inference_mode()
def test_a_gguf_model_on_the_torch_path_is_the_dense_load_and_holds_the_files_bytes(tmp_path, monkeypatch, key):
    gguf, dense, expanding, stock = _models(tmp_path, monkeypatch, key)
    linears = [m for m in expanding.modules() if isinstance(m, ExpandingLinear)]
    assert not any(isinstance(m, (BlockLinear, torch.nn.Linear)) for m in expanding.modules())
    assert isinstance(expanding.get_input_embeddings(), ExpandingEmbedding) and weights_mode(expanding) == "gguf"
    header = read_header(gguf)
    file_kinds = {t.qtype for t in header.tensors if t.qtype in BLOCK_TYPES}
    assert {m.qtype for m in linears} == file_kinds
    if key == "llama-every-type":
        assert file_kinds == set(BLOCK_TYPES)
    else:  # an untied embedding keeps the file's token_embd blocks, its rows expanded as they are looked up
        assert expanding.get_input_embeddings().table is not expanding.lm_head
    # the weights it holds: the file's blocks byte for byte, within 15% of the file's tensor bytes in all
    blocks = sum(m.blocks.numel() for m in linears)
    assert blocks == sum(t.row_bytes * t.shape[1] for t in header.tensors if t.qtype in BLOCK_TYPES)
    rotary = sum(b.numel() * b.element_size() for n, b in expanding.named_buffers() if "inv_freq" in n)
    assert held_bytes(expanding) - rotary == gguf_device_bytes(gguf, dtype_bytes=4).held
    assert held_bytes(expanding) <= 1.15 * header.data_bytes < held_bytes(dense)
    assert num_weights(expanding) == num_weights(dense)
    ids = torch.randint(0, dense.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(5))
    for piece in (ids, ids[:, :1]):  # a prefill chunk and a decode row: the same weights, the same matmuls
        assert torch.equal(expanding(piece).logits, dense(piece).logits)
    kwargs = dict(max_new_tokens=12, do_sample=False, min_new_tokens=12, output_logits=True,
                  return_dict_in_generate=True)
    expected = dense.generate(ids, **kwargs)
    assert torch.equal(expanding.generate(ids, **kwargs).sequences, expected.sequences)
    # head-wise attention (every head offloaded, chunked prefill) equals stock attention over the same GGUF model
    expected = stock.generate(ids, **kwargs)
    cache = engine.HeadInferCache(expanding.config, resident_slots=0, chunk_size=8)
    actual = expanding.generate(ids, past_key_values=cache, prefill_chunk_size=8, **kwargs)
    assert torch.equal(actual.sequences, expected.sequences)
    for step, (a, e) in enumerate(zip(actual.logits, expected.logits)):
        assert rel_diff(a, e) < 10 * RTOL, step


def test_gguf_weights_are_taken_on_a_gpu_in_its_dtype_and_on_the_cpu_in_fp32():
    assert _weights_and_dtype("m.gguf", "m.gguf", "cuda", "auto", torch.bfloat16, "gguf") == ("gguf", torch.bfloat16)
    assert _weights_and_dtype("m.gguf", "m.gguf", "cuda:0", "float16", torch.float16, "gguf")[1] == torch.float16
    with pytest.raises(ValueError, match="compute in float32"):  # the C kernels sum in fp32
        _weights_and_dtype("m.gguf", "m.gguf", "cpu", "bfloat16", torch.bfloat16, "gguf")


def test_the_planners_bytes_count_blocks_as_stored_and_the_rest_in_the_compute_dtype(tmp_path):
    """A header with a Q4_K matrix, a Q6_K one, a Q3_K one (a type the expansion does not read: dense) and a norm."""
    from gguf import GGMLQuantizationType, GGUFWriter

    rng = np.random.default_rng(0)
    tensors = {"blk.0.ffn_up.weight": random_block_rows(rng, 12, 512, 256), "output.weight":
               random_block_rows(rng, 14, 300, 256), "blk.0.attn_q.weight": torch.zeros(64, 256 // 256 * 110,
                                                                                           dtype=torch.uint8)}
    writer = GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    for name, qtype in zip(tensors, (12, 14, 11)):
        writer.add_tensor(name, tensors[name].numpy(), raw_dtype=GGMLQuantizationType(qtype))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(256, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    planned = gguf_device_bytes(tmp_path / "m.gguf")
    assert planned.held == 512 * 144 + 300 * 210 + 64 * 256 * 2 + 256 * 2
    assert planned.file_tensors == 512 * 144 + 300 * 210 + 64 * 110 + 256 * 4
    assert planned.quantization == "Q4_K+Q6_K"
    assert planned.scratch == 512 * 256 * gguf_device.SCRATCH_PER_WEIGHT  # the largest layer, whole (one slice)


@pytest.mark.slow
@torch.inference_mode()
def test_the_real_smollm2_gguf_on_the_torch_path_answers_as_stock_dense_does(smollm2, monkeypatch):
    """The embedded Q4_1 GGUF (a tied Q8_0 table) expanded by torch: head-wise over 1,024 tokens of real text gives
    stock dense fp32's greedy tokens, and it holds its file's tensor bytes (under a byte a weight)."""
    from smollm2_runs import real_text

    from engine.models.loader import _embedded_gguf

    dense, tokenizer = smollm2
    monkeypatch.setenv(gguf_device.FORCE_ENV, "1")
    model, _ = load_model(str(_embedded_gguf()), device="cpu", weights="gguf", with_tokenizer=False)
    assert isinstance(model.lm_head, ExpandingLinear) and model.get_input_embeddings().table is model.lm_head
    assert held_bytes(model) <= 1.15 * gguf_device_bytes(_embedded_gguf()).file_tensors
    ids = torch.tensor([tokenizer(real_text(), add_special_tokens=False)["input_ids"][:1024]])
    kwargs = dict(max_new_tokens=16, do_sample=False, output_logits=True, return_dict_in_generate=True)
    expected = dense.generate(ids, **kwargs)
    cache = engine.HeadInferCache(model.config, resident_slots=0, chunk_size=256)
    actual = model.generate(ids, past_key_values=cache, prefill_chunk_size=256, **kwargs)
    assert torch.equal(actual.sequences, expected.sequences)
    for step, (a, e) in enumerate(zip(actual.logits, expected.logits)):
        assert rel_diff(a, e) < 10 * RTOL, step


@pytest.mark.parametrize(("shape", "free_gib", "expected"), [
    (LLAMA_8B_SHAPE, 24, "dense"),  # Llama 3.1 8B: 16 GB of bf16 fit a 24 GiB card's buffers
    (SHAPE_27B, 24, "gguf"),  # a 27B-class shape: 45 GB of bf16 do not; the blocks stay
    (LLAMA_8B_SHAPE, 16, "gguf"),  # the 8B on a 16 GiB card: they do not either
], ids=["8b-24gib", "27b-24gib", "8b-16gib"])
def test_auto_on_a_gpu_keeps_a_ggufs_blocks_where_its_dense_weights_do_not_fit(tmp_path, monkeypatch, shape,
                                                                               free_gib, expected):
    from engine.models import quantized
    from engine.models.loader import auto_weights

    gguf = header_only_gguf(tmp_path / "model.gguf", *shape)
    # The card's reading (no GPU here): a stand-in for a GPU of ``free_gib`` free before the model loads.
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free_gib << 30, free_gib << 30))
    monkeypatch.setattr(quantized, "installed", lambda library: True)
    assert auto_weights(str(gguf), gguf.name, "cuda", torch.bfloat16) == expected
    # the same rule as the quantized modes: dense exactly where a safetensors model of that config loads bf16
    from engine.models.loader import read_config

    dense_fits = quantized.load_mode("auto", read_config(str(gguf)), "cuda", torch.bfloat16) == "dense"
    assert dense_fits == (expected == "dense")
