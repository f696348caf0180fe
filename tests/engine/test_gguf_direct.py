"""A GGUF's first load as blocks straight from the file (``engine.models.gguf_direct``): the very model the fp32
folder's load and the block matcher build (the same blocks, the same dense tensors, bit for bit), without the fp32
folder; where the file cannot be read that way, the fp32 folder's way, said in the log."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch
from gguf_files import k_quant_blocks, write_tiny_gguf
from transformers import LlamaConfig

from engine.cpu import gguf_blocks
from engine.cpu.gguf_blocks import BLOCK_TYPES, BlockEmbedding, BlockLinear
from engine.models import loader
from engine.models.gguf_direct import write_files
from engine.models.loader import gguf_cache_entry, load_model
from engine.models.weights_cache import _unique_tensors
from engine.paths import cache_dir


def _every_type_llama():
    return LlamaConfig(vocab_size=300, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       tie_word_embeddings=False)


def _tiny(tmp_path, key: str, **kwargs):
    """(the GGUF written, its architecture): tiny_configs' ``key`` in Q8_0, or a 256-wide Llama of every type."""
    from archs import tiny_configs

    if key == "llama-every-type":  # the K types' super-blocks; Llama's q/k rows permuted in the file
        config, architecture, kwargs["blocks"] = _every_type_llama(), "llama", k_quant_blocks()
    else:
        config = tiny_configs()[key]
        architecture = {"gemma3_text": "gemma3"}.get(config.model_type, config.model_type)
    if architecture == "qwen3":
        config.head_dim = 128  # transformers reads no head_dim from a qwen3 GGUF: the default, as real files have
    gguf = tmp_path / f"{key}.gguf"
    write_tiny_gguf(gguf, architecture, config, with_tokenizer=True, **kwargs)
    return gguf


def _conversions(monkeypatch) -> list:
    """The fp32 conversions a load makes (``loader._convert_checked``, still run)."""
    calls = []
    real = loader._convert_checked
    monkeypatch.setattr(loader, "_convert_checked", lambda gguf, target: calls.append(gguf) or real(gguf, target))
    return calls


def _through_fp32(gguf, tmp_path):
    """The model the fp32 folder's first load gives: the file converted, loaded, its blocks matched."""
    model, _, _ = loader._gguf_through_fp32(str(gguf), gguf, tmp_path / "no-dense-folder", tmp_path, "headinfer",
                                            False)
    return model


def assert_same_model(actual, expected) -> None:
    """Every tensor of both, under every name, bit for bit; the same block layers and the same ties."""
    assert type(actual) is type(expected)
    assert gguf_blocks.block_layout(actual) == gguf_blocks.block_layout(expected)
    tensors, ties = _unique_tensors(actual)
    reference, reference_ties = _unique_tensors(expected)
    assert set(tensors) == set(reference) and ties == reference_ties
    for name, tensor in tensors.items():
        other = reference[name]
        assert tensor.dtype == other.dtype and torch.equal(tensor, other), name
    assert actual.config.to_dict() | {"_name_or_path": ""} == expected.config.to_dict() | {"_name_or_path": ""}


@pytest.mark.parametrize("key", ["llama-every-type", "llama-gqa", "llama-mha", "qwen2-window", "qwen3",
                                 "gemma2-softcap", "gemma3-window"])
@torch.inference_mode()
def test_the_first_load_straight_from_the_file_is_the_fp32_folders_model(tmp_path, monkeypatch, key):
    """Each streamed architecture (Llama's q/k rows permuted in block rows, left as stored without a KV head count;
    Qwen2's biases; Gemma's norm offset and its scaled tied embedding): no fp32 folder, the same model."""
    gguf = _tiny(tmp_path, key, kv_heads_in_file=key != "llama-mha")
    conversions = _conversions(monkeypatch)
    model, tokenizer = load_model(str(gguf), device="cpu", weights="gguf")
    assert conversions == [] and tokenizer is not None and gguf_cache_entry(str(gguf)).folder.is_dir()
    expected = _through_fp32(gguf, tmp_path / "fp32")
    assert_same_model(model, expected)
    if key == "llama-every-type":
        assert {m.qtype for m in model.modules() if isinstance(m, BlockLinear)} == set(BLOCK_TYPES)
        assert isinstance(model.get_input_embeddings(), BlockEmbedding)
    ids = torch.randint(0, model.config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(3))
    assert torch.equal(model(ids).logits, expected(ids).logits)


def test_permuted_rows_are_copies_and_rows_in_the_files_order_map_the_file(tmp_path):
    from engine.models.gguf_direct import build

    gguf = _tiny(tmp_path, "llama-every-type")
    config = loader._read_config(str(gguf.parent), gguf.name, False)
    files = tmp_path / "files"
    files.mkdir()
    streamed = write_files(gguf, config, files)
    assert {path.name for path in files.iterdir()} >= {"config.json", "generation_config.json", "tokenizer.json"}
    config = loader._read_config(str(files), None, False)
    model = build(streamed, lambda: loader._skeleton(config, torch.float32, "headinfer", "dense", {}), gguf.name)
    raw = {streamed.names[info.name].removesuffix(".weight"): array for info, array in streamed.tensors}
    for name, module in model.named_modules():
        if isinstance(module, BlockLinear) and name in raw:
            maps_file = module.blocks.data_ptr() == raw[name].ctypes.data
            assert maps_file == (not name.endswith(("q_proj", "k_proj"))), name


@torch.inference_mode()
def test_a_file_short_of_a_tensor_goes_through_the_fp32_folder_and_says_why(tmp_path, monkeypatch, caplog):
    gguf = _tiny(tmp_path, "llama-gqa", leave_out="blk.1.attn_norm.weight")
    conversions = _conversions(monkeypatch)
    with caplog.at_level(logging.INFO, logger="engine.models"):
        model, _ = load_model(str(gguf), device="cpu", weights="gguf", with_tokenizer=False)
    assert conversions == [gguf] and gguf_blocks.block_layout(model)
    assert "neither blocks nor in the file (model.layers.1.input_layernorm.weight)" in caplog.text
    assert not list((cache_dir() / "models").glob(".gguf-*"))  # the scratch folder is gone


def test_an_architecture_not_converted_per_tensor_writes_nothing(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "moe.gguf"
    writer = GGUFWriter(str(path), "qwen2moe")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (tmp_path / "files").mkdir()
    assert write_files(path, None, tmp_path / "files") is None and not list((tmp_path / "files").iterdir())


@pytest.mark.slow
@torch.inference_mode()
def test_the_real_smollm2_gguf_straight_from_the_file_is_the_fp32_folders_model(tmp_path, monkeypatch):
    """The embedded Q4_1 file (its q/k rows permuted, a tied Q8_0 table): the same 211 block layers and dense
    tensors as the fp32 folder's load, so the same greedy tokens."""
    from engine.models.loader import _embedded_gguf

    gguf = _embedded_gguf()
    shutil.rmtree(gguf_cache_entry(str(gguf)).folder, ignore_errors=True)
    conversions = _conversions(monkeypatch)
    model, tokenizer = load_model(str(gguf), device="cpu", weights="gguf")
    assert conversions == [] and len(gguf_blocks.block_layout(model)) == 211
    expected = _through_fp32(gguf, tmp_path)
    assert_same_model(model, expected)
    ids = tokenizer("The capital of France is Paris. The capital of Germany is", return_tensors="pt").input_ids
    kwargs = dict(max_new_tokens=12, do_sample=False)
    assert torch.equal(model.generate(ids, **kwargs), expected.generate(ids, **kwargs))
