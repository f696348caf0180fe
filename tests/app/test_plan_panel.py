"""The plan panel names what 8-bit KV or a disk tier would reach when memory is what binds."""

from transformers import LlamaConfig

from app import render
from engine.planning.capacity import capacity_options
from engine.planning.memory import ModelShape, make_plan
from engine.planning.policy import OffloadPolicy

GIB = 1 << 30


def test_reaches_tile_lists_the_options_and_lossy_kv_is_labelled(tmp_path):
    shape = ModelShape.from_config(LlamaConfig(num_hidden_layers=32, num_key_value_heads=8, head_dim=128,
                                               num_attention_heads=32, hidden_size=4096,
                                               max_position_embeddings=1 << 23), dtype_bytes=2)
    plan = make_plan(shape, OffloadPolicy(), 1 << 20, device_is_cuda=True, gpu_budget=24 * GIB, host_budget=32 * GIB)
    assert plan.limited_by == "memory"
    options = capacity_options(shape, OffloadPolicy(disk_dir=str(tmp_path)), device_is_cuda=True,
                               gpu_budget=24 * GIB, host_budget=32 * GIB)
    html = render.plan_panel(plan, 1000, 10.0, "int8", options)
    assert "Reaches" in html and "RAM + 8-bit (lossy)" in html and "RAM + disk" in html
    assert "int8, lossy" in html  # KV storage named as lossy wherever it is on
    assert "Reaches" not in render.plan_panel(plan, 1000, 10.0)


def test_a_truncated_read_shows_the_plan_of_what_was_read():
    shape = ModelShape.from_config(LlamaConfig(num_hidden_layers=2, num_key_value_heads=2, head_dim=16,
                                               num_attention_heads=4, hidden_size=64,
                                               max_position_embeddings=8192), dtype_bytes=4)
    plan = make_plan(shape, OffloadPolicy(), 7_000 + 1024, device_is_cuda=False, gpu_budget=None,
                     host_budget=32 * GIB)
    html = render.plan_panel(plan, 7_000, 30.0, truncated_from=20_000)
    assert 'data-fits="true"' in html and 'data-tokens="7000"' in html and 'data-truncated-from="20000"' in html
    assert "Read the first 7,000 tokens of 20,000" in html and "truncated to fit" in html
    assert "Too long" not in html and "truncated" not in render.plan_panel(plan, 7_000, 30.0).lower()
