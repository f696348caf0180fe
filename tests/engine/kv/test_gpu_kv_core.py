"""The KV core on CUDA: page-locking errors, unlocking, the decode hot path's overheads, fused attention routes.

Marked ``gpu``: skipped without CUDA (CI), run by ``python -m benchmarks.gpu.gpu_all`` on a lent GPU.
"""

from __future__ import annotations


import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

import engine
from double_registering import DoubleRegistering
from opcount import OpCounter
from engine.kv import HostMemory, kernels, windowed
from engine.errors import PinningError
from engine.kv.pinned import CudaRuntime

pytestmark = pytest.mark.gpu


def test_refused_registration_leaves_no_sticky_error_for_the_next_launch():
    runtime = DoubleRegistering(CudaRuntime())
    memory = HostMemory(True, fence=torch.cuda.synchronize, runtime=runtime)
    with pytest.raises(PinningError):
        memory.empty((1 << 20,), torch.uint8)
    x = torch.zeros(16, device="cuda").add_(1)  # would raise the stale error if it were still set
    torch.cuda.synchronize()
    assert float(x.sum()) == 16


def _models(num_layers=32, num_kv_heads=8):
    cfg = LlamaConfig(hidden_size=256, intermediate_size=64, num_hidden_layers=num_layers, num_attention_heads=32,
                      num_key_value_heads=num_kv_heads, head_dim=8, vocab_size=97, max_position_embeddings=4096)
    torch.manual_seed(0)
    stock = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").cuda().eval()
    headinfer = AutoModelForCausalLM.from_config(cfg, attn_implementation="headinfer").cuda().eval()
    headinfer.load_state_dict(stock.state_dict())
    return stock, headinfer



@torch.inference_mode()
def _decode(model, cache, monkeypatch):
    ids = torch.randint(0, 97, (1, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    model(ids, past_key_values=cache)
    model(ids[:, :1], past_key_values=cache)
    created = []
    real_init = torch.cuda.Event.__init__
    monkeypatch.setattr(torch.cuda.Event, "__init__", lambda self, *a, **k: (created.append(1), real_init(self, *a, **k))[1])
    counter = OpCounter()
    with counter:
        logits = model(ids[:, 1:2], past_key_values=cache).logits
    monkeypatch.setattr(torch.cuda.Event, "__init__", real_init)
    return counter.ops, len(created), logits


@pytest.mark.parametrize("group, limit", [(8, 2.0), (1, 4.0)])
def test_decode_hot_path_has_no_new_events_record_stream_or_pinned_queries(group, limit, monkeypatch):
    stock, headinfer = _models()
    stock_ops, _, expected = _decode(stock, DynamicCache(config=stock.config), monkeypatch)
    cache = engine.HeadInferCache(headinfer.config, device="cuda", head_group_size=group, resident_slots=0)
    ops, events, actual = _decode(headinfer, cache, monkeypatch)
    assert cache.kv_bytes()["host"] > 0
    assert events == 0, "events are preallocated and re-recorded"
    assert ops["aten.record_stream.default"] == 0 and ops["aten.is_pinned.default"] == 0
    assert sum(ops.values()) <= limit * sum(stock_ops.values())
    assert torch.equal(actual.argmax(-1), expected.argmax(-1))


def test_release_unlocks_host_memory_after_the_streams_are_idle():
    _, headinfer = _models(num_layers=2)
    cache = engine.HeadInferCache(headinfer.config, device="cuda", head_group_size=1, resident_slots=0)
    with torch.inference_mode():
        headinfer(torch.randint(0, 97, (1, 300), device="cuda"), past_key_values=cache)
    host = cache._host
    # One registration per layer: a layer's streamed homes share one tensor (``kv/homes.py``: adjacent groups
    # are fetched with one copy), so 2 layers of 8 groups register 2 buffers, not 16 (the H200 run of 2026-11-27
    # failed on the old count).
    assert host.num_registered == 2
    assert sum(t.nbytes for t in host._registered.values()) == cache.kv_bytes()["host"]
    cache.release()
    assert host.num_registered == 0
    torch.zeros(1, device="cuda").add_(1)
    torch.cuda.synchronize()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_windowed_gqa_prefill_chunk_runs_a_fused_kernel_without_a_score_tensor(dtype):
    """Mistral-7B's attention shape for one group (g=1, 4 query heads), chunk 4096, window 4096."""
    chunk, window, past, head_dim = 4096, 4096, 8192, 128  # noqa: F841  (past: the shape this case stands for)
    query = torch.randn(1, 4, chunk, head_dim, device="cuda", dtype=dtype)
    block = torch.randn(window - 1 + chunk, 1, 2, 1, head_dim, device="cuda", dtype=dtype)
    torch.cuda.synchronize()
    # The caching allocator hands out a cached block up to 1 MiB larger than a request whole (it splits large
    # blocks only for a bigger remainder) and counts all of it as allocated: what earlier tests in this worker
    # left cached would move the peak by more than the plan's margin here (0.24 MiB fp32, 0.47 MiB bf16).
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    kernels.ROUTE_COUNTS.clear()
    out = kernels.attend_span(query, block, q_offset=window - 1, scaling=head_dim**-0.5, window=window)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    scores = 4 * chunk * (window - 1 + chunk) * 4  # one fp32 [heads, chunk, keys] tensor
    assert out.shape == (1, 4, chunk, head_dim)
    assert extra < scores / 4, (f"{extra / 2**20:.0f} MiB extra: a score tensor was materialised "
                                f"(routes {dict(kernels.ROUTE_COUNTS)})")
    assert "tiled-math" not in kernels.ROUTE_COUNTS, dict(kernels.ROUTE_COUNTS)
    # What the plan counts for it (the old route's masks and repeated K/V took 320 / 176 MiB on an H200).
    planned = windowed.scratch_bytes(1, 4, 1, head_dim, window, chunk, query.element_size(), cuda=True)
    assert extra - out.nbytes <= planned, f"{(extra - out.nbytes) / 2**20:.1f} MiB > {planned / 2**20:.1f} planned"


@pytest.mark.parametrize("kv_dtype", [None, "int8"])
@pytest.mark.parametrize("overlap", [True, False])
def test_window_rings_and_8bit_homes_stream_correctly_on_cuda(kv_dtype, overlap):
    """Rings wrapping every few tokens (two-part fetches and appends on the side streams), exact or 8-bit."""
    from transformers import MistralConfig

    cfg = MistralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=97, max_position_embeddings=256, sliding_window=8)
    torch.manual_seed(0)
    stock = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").cuda().eval()
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="headinfer").cuda().eval()
    model.load_state_dict(stock.state_dict())
    ids = torch.randint(0, 97, (1, 60), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    cache = engine.HeadInferCache(model.config, device="cuda", chunk_size=7, resident_slots=0, head_group_size=1,
                                  overlap=overlap, kv_dtype=kv_dtype)
    with torch.inference_mode():
        expected = stock(ids).logits
        actual = torch.cat([model(ids[:, s : s + 7], past_key_values=cache).logits for s in range(0, 60, 7)], 1)
    error = float((actual - expected).abs().max() / expected.abs().max())
    assert error < (1e-4 if kv_dtype is None else 5e-2), error
    assert cache.layers[0].homes[0].capacity == 8 - 1 + 7


@pytest.mark.parametrize("kv_dtype", [None, "int8"])
@pytest.mark.parametrize("overlap", [True, False])
def test_disk_tier_streams_through_pinned_pieces_exactly_on_cuda(tmp_path, monkeypatch, kv_dtype, overlap):
    """Three quarters of the homes in files: fetches go disk -> pinned piece -> device on the disk stream's
    worker (pieces far smaller than a home, so one fetch is several), appends land through pinned write
    buffers; logits and greedy tokens equal the all-in-RAM cache's, and a snapshot links the files."""
    from engine.kv import disk_stream

    monkeypatch.setattr(disk_stream, "PIECE_BYTES", 4096)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=97, max_position_embeddings=512)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="headinfer").cuda().eval()
    ids = torch.randint(0, 97, (1, 200), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    common = dict(device="cuda", max_context=256, chunk_size=64, head_group_size=1, resident_slots=0,
                  overlap=overlap, kv_dtype=kv_dtype)
    ram = engine.HeadInferCache(model.config, **common)
    from engine.planning.planner import disk_stream_bytes

    stream = disk_stream_bytes(ram.shape, 64, kv_dtype)
    tier = engine.HeadInferCache(model.config, **common, disk_dir=str(tmp_path),
                                 host_memory=ram.plan.host_bytes // 4 + stream)
    assert tier.plan.disk_slots > 0
    with torch.inference_mode():
        feed = lambda cache: torch.cat([model(ids[:, s : s + 64], past_key_values=cache).logits  # noqa: E731
                                        for s in range(0, 200, 64)], 1)
        expected, actual = feed(ram), feed(tier)
        assert torch.equal(actual, expected)
        for _ in range(6):
            token = expected[:, -1:].argmax(-1)
            expected, actual = model(token, past_key_values=ram).logits, model(token, past_key_values=tier).logits
            assert torch.equal(actual, expected)
    transfer = tier.transfer
    assert transfer.disk.num_fetches > 0
    if overlap:  # prefetched one step ahead: a few misses, at most two per layer
        assert transfer.num_on_demand <= 2 * 4
    else:  # nothing is prefetched without overlap: every fetch is on demand (the first GPU run: 80 of 80)
        assert transfer.num_on_demand == transfer.num_fetches
