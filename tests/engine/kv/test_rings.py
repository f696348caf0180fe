"""Sliding-window layers keep a ring of window + one chunk: exact, and croppable back to an anchor."""

from __future__ import annotations

import pytest
import torch
from archs import build_pair
from parity import rel_diff
from transformers import AutoModelForCausalLM, DynamicCache, MistralConfig

import engine

SLIDING = ["mistral-window", "qwen2-window", "gemma2-softcap", "gemma3-window"]  # window 8 in every one
CHUNK = 7  # policy chunk: rings of 8 - 1 + 7 = 14 tokens, far shorter than the prompts
RTOL = 1e-5


@pytest.fixture(scope="module", params=SLIDING)
def pair(request, tmp_path_factory):
    stock, headinfer = build_pair(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, stock, headinfer


def ids_of(n: int, seed: int = 7) -> torch.Tensor:
    return torch.randint(0, 97, (1, n), generator=torch.Generator().manual_seed(seed))


def feed(model, ids, cache, chunk):
    return torch.cat([model(ids[:, s : s + chunk], past_key_values=cache).logits
                      for s in range(0, ids.shape[1], chunk)], dim=1)


@pytest.mark.parametrize("resident_slots", [None, 0], ids=["resident", "offloaded"])
@pytest.mark.parametrize("chunk", [5, CHUNK, 16], ids=["short", "policy", "longer-than-policy"])
@torch.inference_mode()
def test_rings_wrap_many_times_and_stay_exact(pair, resident_slots, chunk):
    name, stock, headinfer = pair
    ids = ids_of(45)
    cache = engine.HeadInferCache(headinfer.config, chunk_size=CHUNK, resident_slots=resident_slots,
                                  head_group_size=1)
    assert rel_diff(feed(headinfer, ids, cache, chunk), stock(ids).logits) < RTOL, name
    sliding = [layer for layer in cache.layers if layer.window is not None]
    assert sliding and all(layer.homes[0].capacity == 8 - 1 + max(CHUNK, chunk) for layer in sliding)
    stock_cache = DynamicCache(config=stock.config)
    expected = stock(ids, past_key_values=stock_cache).logits[:, -1]
    for _ in range(12):  # decode far past the ring's length
        token = expected.argmax(-1, keepdim=True)
        expected = stock(token, past_key_values=stock_cache).logits[:, -1]
        actual = headinfer(token, past_key_values=cache).logits[:, -1]
        assert rel_diff(actual, expected) < RTOL, name


@torch.inference_mode()
def test_new_conversation_crops_back_to_the_anchored_document(pair):
    name, stock, headinfer = pair
    document, first, second = ids_of(40), ids_of(20, seed=8), ids_of(6, seed=9)
    cache = engine.HeadInferCache(headinfer.config, chunk_size=CHUNK, resident_slots=0, head_group_size=1)
    feed(headinfer, document, cache, CHUNK)
    cache.anchor()  # the end of the document
    feed(headinfer, first, cache, CHUNK)  # a conversation much longer than a chunk overwrites the rings
    with pytest.raises(ValueError, match="sliding-window"):
        cache.crop_to(30)  # neither in the rings nor anchored
    cache.crop_to(40)
    actual = feed(headinfer, second, cache, CHUNK)
    expected = stock(torch.cat([document, second], dim=1)).logits[:, 40:]
    assert rel_diff(actual, expected) < RTOL, name
    cache.crop_to(44)  # back by two: still in the rings
    assert rel_diff(feed(headinfer, second[:, 4:], cache, CHUNK), expected[:, 4:]) < RTOL, name


def test_all_sliding_model_keeps_window_plus_chunk_of_host_kv_per_layer():
    config = MistralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=97, max_position_embeddings=4096, sliding_window=64)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="headinfer").eval()
    cache = engine.HeadInferCache(model.config, chunk_size=256, resident_slots=0, max_context=2048, device="cpu")
    with torch.inference_mode():
        feed(model, torch.randint(0, 97, (1, 2048)), cache, 256)
    per_token_layer = 2 * 2 * 16 * 4  # K+V x KV heads x head_dim x fp32
    host_tokens_per_layer = cache.kv_bytes()["host"] / per_token_layer / 2
    assert host_tokens_per_layer <= 1.25 * (64 + 256)
    assert cache.kv_bytes()["host"] <= cache.plan.host_bytes  # the planner counts the rings


@torch.inference_mode()
def test_snapshot_of_rings_restores_and_continues_exactly(pair, tmp_path):
    from engine.store.files import read_snapshot, write_snapshot
    from engine.store.fingerprint import ModelFingerprint, token_ids_digest
    from engine.store.format import SnapshotIdentity, read_header

    name, stock, headinfer = pair
    ids = ids_of(45)
    cache = engine.HeadInferCache(headinfer.config, chunk_size=CHUNK, resident_slots=0, head_group_size=1)
    feed(headinfer, ids[:, :40], cache, CHUNK)
    identity = SnapshotIdentity(ModelFingerprint(name, name, "0", "0"), "float32", "0",
                                token_ids_digest(ids[0, :40].tolist()), 40)
    write_snapshot(tmp_path / "snap", cache, identity, ids[0, :40].tolist())
    restored = engine.HeadInferCache(headinfer.config, chunk_size=16, resident_slots=0, head_group_size=2)
    read_snapshot(tmp_path / "snap", read_header(tmp_path / "snap"), restored)  # other ring size and grouping
    assert restored.get_seq_length() == 40
    actual = feed(headinfer, ids[:, 40:], restored, CHUNK)
    assert rel_diff(actual, stock(ids).logits[:, 40:]) < RTOL, name


@torch.inference_mode()
def test_a_ring_cache_can_always_be_emptied_and_refilled(pair):
    name, stock, headinfer = pair
    ids = ids_of(45)
    cache = engine.HeadInferCache(headinfer.config, chunk_size=CHUNK, resident_slots=0, head_group_size=1)
    feed(headinfer, ids, cache, CHUNK)
    cache.crop_to(0)  # nothing before position 0 is needed: always allowed
    assert rel_diff(feed(headinfer, ids, cache, CHUNK), stock(ids).logits) < RTOL, name
