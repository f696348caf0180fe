"""Gemma 4 through the head-wise cache: each layer's homes in its own shape, KV-sharing consumers attending their
producer's homes, the global layers' proportional partial RoPE (applied by the model before attention)."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DummyLayer

import engine
from archs import build_pair, tiny_configs
from engine.errors import InputError
from engine.planning.allocations import HOMES


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return build_pair("gemma4-shared-kv", tmp_path_factory.mktemp("gemma4-shared"))


def test_the_grid_covers_what_gemma4_varies():
    configs = {name: config.get_text_config() for name, config in tiny_configs().items() if name.startswith("gemma4")}
    assert {c.per_layer_config[i].head_dim for c in configs.values() for i in range(c.num_hidden_layers)} == {16, 32}
    assert configs["gemma4-head-dims"].rope_parameters["full_attention"] == {
        "rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}
    assert "reuse" in configs["gemma4-shared-kv"].kv_sharing_modes
    global_kv = configs["gemma4-global-kv"]
    assert [global_kv.per_layer_config[i].num_key_value_heads for i in range(4)] == [2, 1, 2, 1]


@torch.inference_mode()
def test_homes_exist_only_where_a_layer_keeps_kv(shared):
    """Six layers, the last two reusing layers 2 and 3: four layers of homes, each at its own head_dim; the cache
    holds exactly the plan's homes; the consumers hold nothing."""
    stock, headinfer = shared
    cache = engine.HeadInferCache(headinfer.config, resident_slots=0, max_context=64, chunk_size=16)
    ids = torch.randint(0, 97, (1, 20), generator=torch.Generator().manual_seed(3))
    for start in (0, 16):  # (chunks no longer than planned: the window rings hold a window plus one chunk)
        headinfer(ids[:, start : start + 16], past_key_values=cache)
    assert [layer.layer_idx for layer in cache.kv_layers] == [0, 1, 2, 3]
    assert [type(cache.layers[i]) for i in (4, 5)] == [DummyLayer, DummyLayer]
    assert [layer.homes[0].kv.shape[-1] for layer in cache.kv_layers] == [16, 32, 16, 32]
    assert dict((layer.layer_idx, layer.consumers) for layer in cache.kv_layers) == {0: (), 1: (), 2: (4,), 3: (5,)}
    assert cache.ledger.held(HOMES) == cache.plan.allocations[HOMES]
    assert cache.get_seq_length() == 20


@torch.inference_mode()
def test_a_consumer_attends_its_producers_past_not_the_chunk_alone(shared):
    """Without the consumers' route entries the consumer layers would find none and attend the chunk alone: the
    logits leave stock's."""
    stock, headinfer = shared
    ids = torch.randint(0, 97, (1, 30), generator=torch.Generator().manual_seed(5))
    expected = stock(ids).logits
    cache = engine.HeadInferCache(headinfer.config, resident_slots=0, chunk_size=10)
    actual = torch.cat([headinfer(ids[:, s : s + 10], past_key_values=cache).logits for s in (0, 10, 20)], dim=1)
    assert float((actual - expected).abs().max() / expected.abs().max()) < 1e-5
    cache = engine.HeadInferCache(headinfer.config, resident_slots=0, chunk_size=10)
    for layer in cache.kv_layers:
        layer.consumers = ()
    broken = torch.cat([headinfer(ids[:, s : s + 10], past_key_values=cache).logits for s in (0, 10, 20)], dim=1)
    assert float((broken - expected).abs().max() / expected.abs().max()) > 1e-3


def test_a_head_group_that_does_not_divide_the_global_layers_is_refused(tmp_path):
    _, headinfer = build_pair("gemma4-global-kv", tmp_path)
    with pytest.raises(InputError, match="layers of 1 and 2 KV heads"):
        engine.HeadInferCache(headinfer.config, head_group_size=2)
