"""The plan panel says how much is pinned and what the staging costs, where a pin limit binds (issue 50)."""

from transformers import LlamaConfig

from app import render
from engine.planning.planner import make_plan
from engine.planning.policy import OffloadPolicy
from engine.planning.shape import ModelShape

GIB = 1 << 30


def _plan(monkeypatch, limit):
    if limit is None:
        monkeypatch.delenv("HEADINFER_PIN_LIMIT", raising=False)
    else:
        monkeypatch.setenv("HEADINFER_PIN_LIMIT", limit)
    shape = ModelShape.from_config(LlamaConfig(num_hidden_layers=32, num_key_value_heads=8, head_dim=128,
                                               num_attention_heads=32, hidden_size=4096,
                                               max_position_embeddings=1 << 20), dtype_bytes=2)
    return make_plan(shape, OffloadPolicy(), 128 * 1024, device_is_cuda=True, gpu_budget=22 * GIB,
                     host_budget=120 * GIB)


def test_past_a_pin_limit_the_panel_names_the_pinned_and_the_staged_bytes(monkeypatch):
    html = render.plan_panel(_plan(monkeypatch, "4GiB"), 1000, 10.0)
    assert "Pinned memory" in html and "of a 4.00 GiB pin limit" in html
    assert "GiB of KV in ordinary memory, through the staging ring" in html


def test_without_a_limit_there_is_no_pinned_tile(monkeypatch):
    assert "Pinned memory" not in render.plan_panel(_plan(monkeypatch, None), 1000, 10.0)
