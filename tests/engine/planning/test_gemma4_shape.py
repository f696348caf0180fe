"""Gemma 4's per-layer KV shapes in the planner: the published 31B and 26B-A4B configs (their config.json values)
and a KV-sharing one, planned without weights."""

from __future__ import annotations

import pytest
from transformers import Gemma4TextConfig

from engine.errors import InputError
from engine.planning.allocations import HOMES, planned_allocations
from engine.planning.planner import make_plan
from engine.planning.policy import OffloadPolicy
from engine.planning.shape import ModelShape, stored_kv_bytes, unsupported_layers

KIB, GIB = 1024, 1 << 30
_PATTERN = ["sliding_attention"] * 5 + ["full_attention"]
_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}
_COMMON = dict(vocab_size=262_144, head_dim=256, global_head_dim=512, sliding_window=1024, attention_k_eq_v=True,
               max_position_embeddings=262_144, final_logit_softcapping=30.0, hidden_size_per_layer_input=0,
               rope_parameters=_ROPE, tie_word_embeddings=True)


def gemma4_31b() -> Gemma4TextConfig:
    """google/gemma-4-31B's text config: 60 layers (50 sliding of 16 KV heads x 256, 10 global of 4 x 512)."""
    return Gemma4TextConfig(**_COMMON, hidden_size=5376, intermediate_size=21504, num_hidden_layers=60,
                            num_attention_heads=32, num_key_value_heads=16, num_global_key_value_heads=4,
                            layer_types=_PATTERN * 10)


def gemma4_26b_a4b() -> Gemma4TextConfig:
    """google/gemma-4-26B-A4B's: 30 layers (25 sliding of 8 KV heads x 256, 5 global of 2 x 512), 128 experts."""
    return Gemma4TextConfig(**_COMMON, hidden_size=2816, intermediate_size=2112, num_hidden_layers=30,
                            num_attention_heads=16, num_key_value_heads=8, num_global_key_value_heads=2,
                            enable_moe_block=True, num_experts=128, top_k_experts=8, moe_intermediate_size=704,
                            layer_types=_PATTERN * 5)


def gemma4_e4b_shared() -> Gemma4TextConfig:
    """A Gemma 4 E4B-shaped config: its last 18 of 42 layers reuse the K/V of layers 22 (sliding) and 23 (global)."""
    return Gemma4TextConfig(**{**_COMMON, "attention_k_eq_v": False}, hidden_size=2560, intermediate_size=10240,
                            num_hidden_layers=42, num_attention_heads=8, num_key_value_heads=2,
                            num_kv_shared_layers=18, layer_types=_PATTERN * 7)


@pytest.mark.parametrize("config, layer_bytes, long_kib", [
    (gemma4_31b, (16 * 256, 4 * 512), 80),  # bf16 K+V: 16 KiB a sliding layer, 8 KiB a global one
    (gemma4_26b_a4b, (8 * 256, 2 * 512), 20),
], ids=["31B", "26B-A4B"])
def test_published_gemma4_shapes_count_each_layers_own_kv(config, layer_bytes, long_kib):
    config = config()
    assert unsupported_layers(config) is None  # (was refused as "KV sharing": every config has "store" modes)
    shape = ModelShape.from_config(config, dtype_bytes=2)
    sliding, full = layer_bytes
    types = config.layer_types
    assert shape.layer_kv_elements == tuple(sliding if t == "sliding_attention" else full for t in types)
    assert (shape.num_kv_heads, shape.head_dim) == (sliding // 256, 512)  # the largest of any layer: buffers' size
    assert shape.kv_bytes_per_token == sum(shape.layer_kv_elements) * 2 * 2
    # Past the windows only the global layers grow: 10 (31B) or 5 of 4 heads x 512 x K,V x bf16 a token.
    million = 1 << 20
    per_token = (stored_kv_bytes(shape, 2 * million, 4096, None) - stored_kv_bytes(shape, million, 4096, None)) / million
    assert per_token == long_kib * KIB


def test_shared_kv_layers_are_counted_once():
    config = gemma4_e4b_shared()
    shape = ModelShape.from_config(config)
    assert shape.num_layers == 24 and shape.kv_layer_indices == tuple(range(24))
    assert dict(shape.shared_layers)[24] == 22 and dict(shape.shared_layers)[41] == 23
    alone = ModelShape.from_config(Gemma4TextConfig(**{**config.to_dict(), "num_kv_shared_layers": 0}))
    assert alone.num_layers == 42  # the consumers' K/V is their producers': the first 24 layers' alone
    assert shape.kv_bytes_per_token == sum(alone.layer_kv_elements[:24]) * 2 * 2 < alone.kv_bytes_per_token


def test_a_head_group_must_divide_every_layers_kv_heads():
    shape = ModelShape.from_config(gemma4_31b())
    with pytest.raises(InputError, match="layers of 4 and 16 KV heads.*use one of 1, 2, 4"):
        OffloadPolicy(head_group_size=8).validate_for(shape.kv_heads)
    OffloadPolicy(head_group_size=4).validate_for(shape.kv_heads)


@pytest.mark.parametrize("config", [gemma4_31b, gemma4_26b_a4b], ids=["31B", "26B-A4B"])
def test_a_4090_plan_of_gemma4_holds_each_layers_homes(config):
    """A 4090 PC's plan at 1M tokens: the homes it allocates are each layer's own shape (a uniform count at the
    largest layer's would be 8x the sliding layers' or 4x the global ones'), and a group divides every layer."""
    shape = ModelShape.from_config(config(), dtype_bytes=2)
    context = 1 << 20
    plan = make_plan(shape, OffloadPolicy(), context, device_is_cuda=True, gpu_budget=24 * GIB - 17 * GIB,
                     host_budget=96 * 10**9)
    assert all(heads % plan.head_group_size == 0 for heads in shape.kv_heads)
    assert plan.total_slots == sum(heads // plan.head_group_size for heads in shape.kv_heads)
    homes = planned_allocations(shape, capacity=context, chunk=4096, group=plan.head_group_size, resident_slots=0,
                                disk_slots=0, cuda=True, kv_dtype=None, host_attention=False)[HOMES]
    assert homes == stored_kv_bytes(shape, context, 4096, None)


def test_launch_checks_the_head_group_against_every_gemma4_layer():
    # launch.py read config.num_key_value_heads, which Gemma 4's config refuses to name for the whole model.
    from app import cli, startup

    parse = cli.build_parser().parse_args
    startup.check_model(parse(["--head-group", "4"]), gemma4_31b())  # divides 16 (sliding) and 4 (global)
    with pytest.raises(InputError, match="--head-group 8"):
        startup.check_model(parse(["--head-group", "8"]), gemma4_31b())  # global layers hold only 4
