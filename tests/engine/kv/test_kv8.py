"""Optional 8-bit host KV: lossy by design, bounded error, half the bytes, snapshots keep their codes."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import engine
from engine.kv import quant


@pytest.mark.parametrize("kv_dtype, tolerance", [("int8", 1 / 127), ("fp8", 1 / 16)])
def test_quantize_roundtrip_error_is_bounded_per_token_and_head(kv_dtype, tolerance):
    torch.manual_seed(0)
    block = torch.randn(50, 1, 2, 3, 64) * torch.logspace(-3, 2, 50)[:, None, None, None, None]
    codes, scales = quant.quantize(block, kv_dtype)
    assert codes.dtype == quant.storage_dtype(kv_dtype) and scales.shape == (50, 1, 2, 3, 1)
    restored = quant.dequantize(codes, scales, torch.empty_like(block))
    # relative to each (token, K/V, head) row's own largest value: small rows keep their precision
    error = (restored - block).abs().amax(-1) / block.abs().amax(-1)
    assert float(error.max()) <= tolerance


def _pair():
    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=97, max_position_embeddings=256)
    torch.manual_seed(0)
    stock = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    model = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="headinfer").eval()
    model.load_state_dict(stock.state_dict())
    return stock, model


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
@torch.inference_mode()
def test_8bit_host_kv_is_close_to_exact_and_takes_about_a_quarter_of_fp32(kv_dtype):
    stock, model = _pair()
    ids = torch.randint(0, 97, (1, 60), generator=torch.Generator().manual_seed(1))
    budget = 64 << 20  # a stated host budget: how far each reads within it (the constructor reads no machine)
    exact = engine.HeadInferCache(model.config, device="cpu", chunk_size=16, resident_slots=0, max_context=64,
                                  host_memory=budget)
    coded = engine.HeadInferCache(model.config, device="cpu", chunk_size=16, kv_dtype=kv_dtype, max_context=64,
                                  host_memory=budget)
    for s in range(0, 60, 16):
        expected = model(ids[:, s : s + 16], past_key_values=exact).logits
        actual = model(ids[:, s : s + 16], past_key_values=coded).logits
    assert all(h.is_quantized for layer in coded.layers for h in layer.homes)
    assert float((actual - expected).abs().max() / expected.abs().max()) < 0.05
    assert coded.kv_bytes()["host"] == pytest.approx(exact.kv_bytes()["host"] * (1 + 4 / 16) / 4)
    # The planner counts 8-bit homes (a quarter of fp32 here) and, since the allocation ledger, the ping-pong
    # buffers both caches stream through (two fp32 copies of a layer's K/V at full context: large next to 3 layers).
    assert coded.plan.allocations["homes"] == pytest.approx(exact.plan.allocations["homes"] * (1 + 4 / 16) / 4)
    assert coded.plan.max_context_tokens > 1.3 * exact.plan.max_context_tokens


@torch.inference_mode()
def test_8bit_snapshot_restores_codes_and_refuses_a_session_with_other_kv(tmp_path):
    from engine.store.fingerprint import ModelFingerprint, token_ids_digest
    from engine.store.files import read_snapshot, write_snapshot
    from engine.store.format import SnapshotIdentity, read_header
    from engine.errors import SnapshotError

    _, model = _pair()
    ids = torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(2))
    cache = engine.HeadInferCache(model.config, device="cpu", kv_dtype="int8", max_context=64)
    model(ids[:, :30], past_key_values=cache)
    identity = SnapshotIdentity(ModelFingerprint("llama", "t", "0", "0"), "float32", "0",
                                token_ids_digest(ids[0, :30].tolist()), 30)
    write_snapshot(tmp_path / "s", cache, identity, ids[0, :30].tolist())
    header = read_header(tmp_path / "s")
    restored = engine.HeadInferCache(model.config, device="cpu", kv_dtype="int8", max_context=64)
    read_snapshot(tmp_path / "s", header, restored)
    for a, b in zip(cache.layers, restored.layers):
        assert all(torch.equal(x.kv[:30], y.kv[:30]) and torch.equal(x.planes[1][:30], y.planes[1][:30])
                   for x, y in zip(a.homes, b.homes))
    assert torch.equal(model(ids[:, 30:], past_key_values=cache).logits,
                       model(ids[:, 30:], past_key_values=restored).logits)
    with pytest.raises(SnapshotError, match="read the document again"):
        read_snapshot(tmp_path / "s", header, engine.HeadInferCache(model.config, device="cpu", max_context=64))


def test_kv_dtype_is_validated():
    with pytest.raises(ValueError, match="kv_dtype"):
        engine.OffloadPolicy(kv_dtype="int4")


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
def test_the_host_kernel_reads_8bit_codes_and_dequantizes_them_per_tile(kv_dtype):
    from engine.kv import HostAttention

    torch.manual_seed(0)
    home = torch.randn(300, 1, 2, 2, 64)  # [T, B, 2, g, D]
    codes, scales = quant.quantize(home, kv_dtype)
    dequantized = quant.dequantize(codes, scales, torch.empty(home.shape))
    query = torch.randn(1, 4, 1, 64)
    kernel = HostAttention(tile_bytes=4096)  # many tiles, so most see only part of the scales
    from_codes = kernel.attend(query, [codes], 0, 300, scaling=0.125, scales=[scales])
    from_copy = kernel.attend(query, [dequantized], 0, 300, scaling=0.125)
    assert torch.allclose(from_codes, from_copy, atol=1e-6)


@torch.inference_mode()
def test_host_attention_over_8bit_homes_matches_the_streamed_path(monkeypatch):
    from engine.kv.homes import GroupHome

    stock, model = _pair()
    ids = torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(4))
    streamed = engine.HeadInferCache(model.config, device="cpu", kv_dtype="int8", max_context=64, head_group_size=1)
    on_host = engine.HeadInferCache(model.config, device="cpu", kv_dtype="int8", max_context=64, head_group_size=1,
                                    host_attention="all")
    model(ids[:, :36], past_key_values=streamed), model(ids[:, :36], past_key_values=on_host)
    copies = []  # whole-context dequantized copies (GroupHome.block): the host path must not make them
    block = GroupHome.block
    monkeypatch.setattr(GroupHome, "block", lambda self, *a: copies.append(1) or block(self, *a))
    for t in range(36, 40):  # decode steps: the host kernel reads dequantized homes
        a = model(ids[:, t : t + 1], past_key_values=streamed).logits
        b = model(ids[:, t : t + 1], past_key_values=on_host).logits
        # The streamed path attends the step's own token unquantized (from staging), the host path reads it
        # back from the 8-bit home: both are within the 8-bit error of each other, not bit-identical.
        assert float((a - b).abs().max() / a.abs().max()) < 1e-2
    assert on_host.schedule.host_slots and on_host.host_attention_seconds > 0 and not copies


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_in_place_dequantization_equals_the_fp32_product_rounded_once(kv_dtype, dtype):
    from engine.kv import quant

    block = torch.randn(33, 1, 2, 3, 64, generator=torch.Generator().manual_seed(5)) * 3
    codes, scales = quant.quantize(block, kv_dtype)
    out = torch.empty(block.shape, dtype=dtype)
    quant.dequantize(codes, scales, out=out)
    assert torch.equal(out, (codes.to(torch.float32) * scales).to(dtype))
