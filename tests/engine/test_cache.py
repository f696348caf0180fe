"""HeadInferCache bookkeeping (no model needed), policy validation and refusal of bad inputs."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import engine
from engine import HeadInferCache, OffloadPolicy, PlanError


def config(num_kv_heads: int = 2, **extra) -> LlamaConfig:
    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=num_kv_heads, vocab_size=97, max_position_embeddings=256, **extra)
    cfg._attn_implementation = "headinfer"
    return cfg


def append(cache: HeadInferCache, num_tokens: int, num_kv_heads: int) -> list[torch.Tensor]:
    chunks = []
    for layer_idx in range(len(cache.layers)):
        k = torch.randn(1, num_kv_heads, num_tokens, 16)
        cache.update(k, -k, layer_idx)
        chunks.append(k)
    return chunks


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("resident_slots", [None, 0, 1])
def test_sequence_length_crop_reset_and_contents(num_kv_heads, resident_slots):
    cache = HeadInferCache(config(num_kv_heads), head_group_size=1, resident_slots=resident_slots)
    assert cache.get_seq_length() == 0
    first = append(cache, 5, num_kv_heads)
    second = append(cache, 3, num_kv_heads)
    assert cache.get_seq_length() == 8
    for layer, k1, k2 in zip(cache.layers, first, second):
        for home in layer.homes:
            keys, values = home.keys(0, 8), home.values(0, 8)  # [B, g, 8, D]
            expected = torch.cat([k1, k2], dim=2)[:, home.group.start : home.group.stop]
            assert torch.equal(keys, expected) and torch.equal(values, -expected)
    cache.crop_to(5)
    assert cache.get_seq_length() == 5 and all(layer.length == 5 for layer in cache.layers)
    cache.crop(-2)
    assert cache.get_seq_length() == 3
    with pytest.raises(ValueError):
        cache.crop_to(4)  # cannot grow by cropping
    cache.reset()
    assert cache.get_seq_length() == 0


def test_slots_resident_and_offloaded_are_spread():
    cache = HeadInferCache(config(2), head_group_size=1, resident_slots=2)
    append(cache, 2, 2)
    flags = [home.group.is_resident for layer in cache.layers for home in layer.homes]
    assert len(flags) == 6 and sum(flags) == 2
    assert flags[0] and not flags[1]  # interleaved, not the first two in a row


def test_release_frees_memory_and_cache_is_reusable():
    cache = HeadInferCache(config(2), resident_slots=0, max_context=64)
    append(cache, 4, 2)
    assert cache.kv_bytes()["host"] == 3 * 2 * 2 * 64 * 16 * 4  # layers x heads x (K,V) x capacity x D x fp32
    cache.release()
    assert cache.kv_bytes() == {"device": 0, "host": 0, "disk": 0} and cache.get_seq_length() == 0
    append(cache, 2, 2)
    assert cache.get_seq_length() == 2


def test_store_grows_past_its_preallocation():
    cache = HeadInferCache(config(2), resident_slots=0, max_context=4)
    chunks = [append(cache, 3, 2) for _ in range(3)]
    keys = cache.layers[0].homes[0].keys(0, 9)
    assert torch.equal(keys, torch.cat([c[0] for c in chunks], dim=2))


@pytest.mark.parametrize("kwargs", [
    dict(chunk_size=0), dict(chunk_size=1.5), dict(head_group_size=0), dict(resident_slots=-1),
    dict(max_context=0), dict(gpu_memory=-5), dict(pin_memory="yes"), dict(overlap=None), dict(chunk_size=True),
])
def test_invalid_policy_values_are_refused(kwargs):
    with pytest.raises(ValueError):
        OffloadPolicy(**kwargs)


def test_head_group_larger_than_kv_heads_is_refused():
    with pytest.raises(ValueError, match="exceeds the model's 2 KV heads"):
        HeadInferCache(config(2), head_group_size=3)


def test_context_beyond_host_memory_is_refused_before_allocating():
    with pytest.raises(PlanError, match="host memory"):
        HeadInferCache(config(2), max_context=10_000_000, host_memory=1 << 20, device="cpu")


def test_cache_with_another_attention_is_refused():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(2), attn_implementation="sdpa").eval()
    with pytest.raises(ValueError, match="attn_implementation='headinfer'"):
        model(torch.tensor([[1, 2, 3]]), past_key_values=HeadInferCache(model.config))


def test_padded_batches_are_refused():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(2), attn_implementation="headinfer").eval()
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    with pytest.raises(ValueError, match="padded"):
        model(ids, attention_mask=mask, past_key_values=HeadInferCache(model.config))


def test_attention_name_is_registered_on_import():
    from transformers import AttentionInterface

    assert "headinfer" in AttentionInterface._global_mapping
    assert engine.HeadInferCache is HeadInferCache
