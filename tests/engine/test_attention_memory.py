"""Options within the plan: softcap attention without flash-attn is tiled over queries as well as keys (bounded),
and the planner counts attention's scratch, 8-bit code planes and the sources pass on the device."""

from __future__ import annotations

import math

import torch
from transformers import Gemma2Config, LlamaConfig

from engine.kv import kernels
from engine.planning.plan import GIB
from engine.planning.memory import ModelShape, make_plan
from engine.planning.policy import OffloadPolicy


def eager(query, key, value, q_offset, scaling, softcap):
    n_rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(n_rep, 1), value.repeat_interleave(n_rep, 1)
    scores = torch.tanh(query @ key.transpose(2, 3) * scaling / softcap) * softcap
    q_pos = torch.arange(query.shape[2])[:, None] + q_offset
    scores = scores.masked_fill(torch.arange(key.shape[2])[None, :] > q_pos, float("-inf"))
    return torch.softmax(scores.float(), -1).to(value.dtype) @ value


def test_softcap_tiles_over_queries_and_stays_exact(monkeypatch):
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 4, 40, 16, generator=generator)
    key, value = torch.randn(2, 1, 2, 50, 16, generator=generator).unbind(0)
    expected = eager(query, key, value, 10, 0.25, 2.0)
    # A score tile of 4 heads x 50 keys x 4 bytes per query row: 7 query rows per block.
    monkeypatch.setattr(kernels, "SCORE_TILE_BYTES", 7 * 4 * 4 * 50)
    assert kernels.query_block(1, 4, 40, 50) == 7
    seen = []
    inner = kernels._tiled_keys
    monkeypatch.setattr(kernels, "_tiled_keys", lambda q, k, *a: seen.append((q.shape[2], k.shape[2])) or inner(q, k, *a))
    actual = kernels._tiled(query, key, value, 10, 0.25, None, 2.0)
    assert torch.allclose(actual, expected, atol=1e-5)
    assert len(seen) == math.ceil(40 / 7) and max(q for q, _ in seen) == 7
    assert seen[0][1] == 10 + 7  # a block reads only the keys its queries can see


def test_planner_counts_attention_scratch_codes_and_sources():
    llama = ModelShape.from_config(LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                               num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                               vocab_size=128256), dtype_bytes=2, num_params=8_030_000_000)
    context = 100_000
    plan = make_plan(llama, OffloadPolicy(head_group_size=8, resident_slots=4), context, device_is_cuda=True)
    visible = context
    assert plan.gpu_breakdown["attention"] == 2 * 8 * visible * 128 * 2  # contiguous K and V of one group
    assert plan.gpu_breakdown["kv_codes"] == 0
    assert plan.gpu_breakdown["sources"] == plan.allocations["sources"] * 4 // 32  # 4 of 32 slots resident
    coded = make_plan(llama, OffloadPolicy(head_group_size=8, resident_slots=4, kv_dtype="int8"), context,
                      device_is_cuda=True)
    assert coded.gpu_breakdown["kv_codes"] > 2 * (visible + 4096) * 2 * 8 * 128  # code planes beside the buffers
    assert coded.gpu_breakdown["kv_codes"] < 0.5 * GIB
    # A measured activation peak replaces the estimate.
    measured = make_plan(llama, OffloadPolicy(), context, device_is_cuda=True, activation_bytes=450 << 20)
    assert measured.gpu_breakdown["activations"] == 450 << 20


def test_softcap_model_plans_its_score_tiles():
    gemma = ModelShape.from_config(Gemma2Config(head_dim=256, sliding_window=4096, attn_logit_softcapping=50.0),
                                   dtype_bytes=2, num_params=9 * 10**9)
    assert gemma.attn_softcap
    plan = make_plan(gemma, OffloadPolicy(head_group_size=1, resident_slots=0), 2048, device_is_cuda=True)
    assert plan.gpu_breakdown["attention"] >= kernels.TILED_LIVE_TILES * kernels.SCORE_TILE_BYTES
