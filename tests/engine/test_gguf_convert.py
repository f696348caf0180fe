"""A GGUF converted one tensor at a time (``engine.models.gguf.write_streamed``) holds exactly the tensors stock
transformers builds from the file, under the same names; files it cannot stream convert the stock way."""

from __future__ import annotations

import pytest
import torch
from gguf import GGUFWriter
from gguf_files import write_tiny_gguf
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from engine.models import gguf as gguf_module
from engine.models.gguf import WEIGHTS_NAME, convert_gguf, gguf_names, load_weights, write_streamed
from engine.models.loader import _embedded_gguf


@pytest.mark.parametrize("key, architecture, kv_heads_in_file", [
    ("llama-gqa", "llama", True), ("llama-mha", "llama", False), ("qwen2-window", "qwen2", True),
    ("qwen3", "qwen3", True), ("gemma2-softcap", "gemma2", True), ("gemma3-window", "gemma3", True)])
@torch.inference_mode()
def test_every_streamed_architecture_converts_as_stock_does(tmp_path, key, architecture, kv_heads_in_file):
    """Each of ``STREAMED_ARCHITECTURES``: the same tensors as stock, bit for bit, under the same names (Llama's
    q/k rows reordered, left as stored when the file gives no KV head count, as stock does; Gemma's norm offset)."""
    from archs import tiny_configs

    assert architecture in gguf_module.STREAMED_ARCHITECTURES
    config = tiny_configs()[key]
    if architecture == "qwen3":
        config.head_dim = 128  # transformers reads no head_dim from a qwen3 GGUF: the default, as real files have
    write_tiny_gguf(tmp_path / "tiny.gguf", architecture, config, kv_heads_in_file=kv_heads_in_file)
    config = AutoConfig.from_pretrained(str(tmp_path), gguf_file="tiny.gguf")
    out = tmp_path / "out"
    out.mkdir()
    assert write_streamed(tmp_path / "tiny.gguf", config, out)
    streamed = load_file(out / WEIGHTS_NAME)
    stock = load_weights(AutoModelForCausalLM, str(tmp_path), "tiny.gguf", dtype=torch.float32).state_dict()
    assert set(streamed) <= set(stock) and set(stock) - set(streamed) <= {"lm_head.weight"}
    for name, tensor in streamed.items():
        assert torch.equal(tensor, stock[name]), name


@pytest.mark.slow
@torch.inference_mode()
def test_streamed_conversion_equals_stock_loading_of_the_real_gguf(tmp_path):
    gguf = _embedded_gguf()
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    assert write_streamed(gguf, config, tmp_path)
    streamed = load_file(tmp_path / WEIGHTS_NAME)
    stock = load_weights(AutoModelForCausalLM, str(gguf.parent), gguf.name, dtype=torch.float32)
    expected = stock.state_dict()
    assert set(expected) - set(streamed) == {"lm_head.weight"}  # tied to the embedding: stored once
    assert set(streamed) <= set(expected)
    for name, tensor in streamed.items():  # the q/k row permutation included: bit for bit
        assert tensor.dtype == torch.float32 and torch.equal(tensor, expected[name]), name
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert type(reloaded) is type(stock)
    assert reloaded.lm_head.weight.data_ptr() == reloaded.get_input_embeddings().weight.data_ptr()
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])
    assert torch.equal(reloaded(ids).logits, stock(ids).logits)


def test_the_top_level_name_map_is_the_full_walks():
    """``gguf_names`` asks transformers' map at the top level only (the full walk rebuilds gguf-py's table at every
    submodule): the same names for a Llama-family model."""
    from archs import tiny_configs
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor, get_gguf_hf_weights_map

    config = tiny_configs()["llama-gqa"]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    processor = LlamaTensorProcessor(config=config.to_dict())
    names = gguf_names(model, processor)
    assert names == get_gguf_hf_weights_map(model, processor)
    assert names["blk.0.attn_q.weight"] == "model.layers.0.self_attn.q_proj.weight"


@pytest.mark.parametrize("architecture", ["qwen2moe", "qwen35", "phi3"])
def test_an_architecture_not_shown_per_tensor_converts_the_stock_way(tmp_path, monkeypatch, architecture):
    """The MoE processors merge experts over several tensors, Qwen3.5 converts through transformers' newer GGUF
    path, Phi-3 is not shown here: no streamed file is written, and ``convert_gguf`` falls back to stock loading
    (observed, not run: a real such GGUF is gigabytes)."""
    path = tmp_path / "other.gguf"
    writer = GGUFWriter(str(path), architecture)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    folder = tmp_path / "out"
    folder.mkdir()
    assert write_streamed(path, config=None, folder=folder) is False
    assert list(folder.iterdir()) == []

    stock_loads = []

    class Stock:
        def save_pretrained(self, where):
            (where / "stock").write_text("saved")

    monkeypatch.setattr(gguf_module, "load_weights", lambda *args, **kwargs: stock_loads.append(args) or Stock())
    monkeypatch.setattr(gguf_module.AutoTokenizer, "from_pretrained",
                        lambda *args, **kwargs: type("T", (), {"save_pretrained": lambda self, where: None})())
    convert_gguf(path, tmp_path / "converted", config=object())
    assert len(stock_loads) == 1 and (tmp_path / "converted" / "stock").read_text() == "saved"


def test_the_header_maps_every_tensor_as_gguf_pys_reader_does(tmp_path):
    """``tensor_arrays`` (the streamed conversion's and the block matcher's view of a file) gives each tensor the
    bytes gguf-py's reader gives: the same values dequantized, for float, half, bf16 and block types, any rank."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFReader
    from gguf.quants import dequantize, quantize

    from engine.errors import GGUFHeaderError
    from engine.models.gguf_header import read_header, tensor_arrays

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((6, 64)).astype(np.float32)
    path = tmp_path / "types.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("f32", weight)
    writer.add_tensor("f16", weight.astype(np.float16))
    writer.add_tensor("bf16", quantize(weight, Q.BF16), raw_dtype=Q.BF16)
    writer.add_tensor("q8_0", quantize(weight, Q.Q8_0), raw_dtype=Q.Q8_0)
    writer.add_tensor("vector", weight[0])
    writer.add_tensor("rank3", rng.standard_normal((2, 3, 64)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours = {info.name: (info, raw) for info, raw in tensor_arrays(path, read_header(path))}
    reader = GGUFReader(str(path))
    assert list(ours) == [t.name for t in reader.tensors]
    for tensor in reader.tensors:
        info, raw = ours[tensor.name]
        assert info.qtype == int(tensor.tensor_type)
        assert np.array_equal(dequantize(raw, info.qtype), dequantize(tensor.data, tensor.tensor_type)), tensor.name
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(GGUFHeaderError, match="cut.gguf"):
        tensor_arrays(cut, read_header(cut))
