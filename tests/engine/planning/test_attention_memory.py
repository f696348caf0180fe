"""Options within the plan: softcap attention without flash-attn is tiled over queries as well as keys (bounded),
a sliding window's chunk attends query blocks with small masks (bounded, measured with torch's memory profiler),
and the planner counts attention's scratch, 8-bit code planes and the sources pass on the device."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from transformers import Gemma2Config, LlamaConfig

from benchmarks.gpu.windowed_attention import peak_extra_bytes
from engine.kv import kernels, native, windowed
from engine.planning.plan import GIB
from engine.planning.planner import make_plan
from engine.planning.shape import ModelShape
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


# --- sliding windows: query blocks against their visible keys (issue 30, finding 4) ---------------------------


def windowed_eager(query, key, value, q_offset, scaling, window):
    """fp64 reference: every key, a [Q, K] boolean mask (transformers' sliding_window_overlay rule)."""
    n_rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(n_rep, 1).double(), value.repeat_interleave(n_rep, 1).double()
    scores = query.double() @ key.transpose(2, 3) * scaling
    q_pos = torch.arange(query.shape[2])[:, None] + q_offset
    k_pos = torch.arange(key.shape[2])[None, :]
    scores = scores.masked_fill((k_pos > q_pos) | (k_pos <= q_pos - window), float("-inf"))
    return torch.softmax(scores, -1) @ value


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_windowed_chunk_peak_stays_within_its_planned_scratch(dtype):
    """Mistral-7B's windowed shape for one group (4 query heads on 1 KV head), chunk 4096 after a full window:
    torch's memory profiler sees at most ``windowed.scratch_bytes`` besides the output. The whole-chunk mask
    alone (one byte per query and key, before its additive copy) was already larger than that."""
    chunk, window, head_dim = 4096, 4096, 128
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 4, chunk, head_dim, generator=generator).to(dtype)
    block = torch.randn(window - 1 + chunk, 1, 2, 1, head_dim, generator=generator).to(dtype)
    kernels.ROUTE_COUNTS.clear()
    peak, out = peak_extra_bytes(lambda: kernels.attend_span(query, block, q_offset=window - 1,
                                                              scaling=head_dim**-0.5, window=window))
    planned = windowed.scratch_bytes(1, 4, 1, head_dim, window, chunk, query.element_size(), cuda=False,
                                     cpu_threads=torch.get_num_threads())
    assert peak - out.nbytes <= planned, f"{(peak - out.nbytes) / 2**20:.1f} MiB > {planned / 2**20:.1f} MiB planned"
    # fp32 on a CPU with the C kernel: its prefill route, which reads the window in place (no mask at all)
    route = "cpu-native-prefill" if dtype == torch.float32 and native.kernel() is not None else "window-blocks"
    assert kernels.ROUTE_COUNTS[route] == 1
    assert planned < 16 << 20 < chunk * (window - 1 + chunk)  # smaller than the old route's boolean mask alone



def test_cpu_plans_count_the_amx_packing_of_reduced_precision_kv_only_where_the_cpu_packs(monkeypatch):
    """torch's CPU flash kernel copies bf16/fp16 K/V into AMX-packed blocks on CPUs with AMX (1.6 MiB more than
    planned for the case above on such a CPU, before the plan counted it); fp32 and CPUs without AMX do not."""
    args = (1, 4, 1, 128, 4096, 4096)
    monkeypatch.setattr(windowed, "cpu_packs_reduced", lambda: False)
    plain_bf16, plain_fp32 = (windowed.scratch_bytes(*args, size, cuda=False, cpu_threads=2) for size in (2, 4))
    plain_cuda = windowed.scratch_bytes(*args, 2, cuda=True)
    monkeypatch.setattr(windowed, "cpu_packs_reduced", lambda: True)
    packed_bf16, packed_fp32 = (windowed.scratch_bytes(*args, size, cuda=False, cpu_threads=2) for size in (2, 4))
    block = windowed.query_block(4, 4096, 2, 4096)
    keys = -(-(block + 4095) // 64) * 64
    assert packed_bf16 - plain_bf16 >= 2 * keys * 128 * 2  # the packed keys and values, at least
    assert packed_fp32 == plain_fp32
    assert windowed.scratch_bytes(*args, 2, cuda=True) == plain_cuda  # the GPU's kernels pack nothing on the host


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_windowed_chunk_on_the_cuda_route_stays_within_its_planned_scratch(monkeypatch, dtype):
    """The same shape through the CUDA route (``kernels.FUSED_DEVICES``: K/V copied contiguous per block, no cache
    scratch, as the GPU test calls it), SDPA standing in for CUDA's memory-efficient kernel with what that kernel
    allocates (its output as [B, M, H, Kv]; memory only, its values are not checked here). The block's K/V
    copies were made before its mask was built, so they were alive beside the mask's boolean temporaries:
    0.3 MiB (fp32) / 1.1 MiB (bf16) past ``scratch_bytes(cuda=True)``, which the 2026-11-27 H200 run's
    ``test_windowed_gqa_prefill_chunk_runs_a_fused_kernel_without_a_score_tensor`` checks against."""
    chunk, window, head_dim = 4096, 4096, 128
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 4, chunk, head_dim, generator=generator).to(dtype)
    block = torch.randn(window - 1 + chunk, 1, 2, 1, head_dim, generator=generator).to(dtype)
    calls = []

    def efficient_kernel(q, k, v, attn_mask=None, scale=None):
        calls.append(k.is_contiguous())
        batch, heads, rows, _ = q.shape
        return torch.empty(batch, rows, heads, v.shape[-1], dtype=q.dtype).transpose(1, 2)

    monkeypatch.setattr(kernels, "FUSED_DEVICES", frozenset({"cuda", "cpu"}))
    monkeypatch.setattr(kernels, "sdpa_kernel", lambda backends: contextlib.nullcontext())  # (CPU has no such kernel)
    monkeypatch.setattr(windowed.F, "scaled_dot_product_attention", efficient_kernel)
    kernels.ROUTE_COUNTS.clear()
    peak, out = peak_extra_bytes(lambda: kernels.attend_span(query, block, q_offset=window - 1,
                                                              scaling=head_dim**-0.5, window=window))
    planned = windowed.scratch_bytes(1, 4, 1, head_dim, window, chunk, query.element_size(), cuda=True)
    assert calls and all(calls) and kernels.ROUTE_COUNTS["window-blocks"] == 1
    assert peak - out.nbytes <= planned, f"{(peak - out.nbytes) / 2**20:.2f} MiB > {planned / 2**20:.2f} MiB planned"


def test_windowed_blocks_read_only_visible_keys_with_small_masks_in_the_query_dtype(monkeypatch):
    """Blocks of a few queries (a tiny mask budget): every SDPA call gets its KV head's keys unrepeated, starting
    at the block's first visible key, and a [n_rep * block, keys] additive mask in the query dtype whose rows are
    padded to 16 elements (so SDPA neither converts nor pads it); the result is exact."""
    batch, num_q, num_k, q_len, q_offset, window, head_dim = 2, 8, 2, 37, 20, 8, 16
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(batch, num_q, q_len, head_dim, generator=generator)
    key, value = torch.randn(2, batch, num_k, q_offset + q_len, head_dim, generator=generator).unbind(0)
    monkeypatch.setattr(windowed, "MASK_BYTES", 4 * 4 * 5 * 16)  # n_rep 4, fp32: 5 queries x 16 padded keys
    block = windowed.query_block(4, window, 4, q_len)
    assert block == 5
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        calls.append((q.shape, k.clone(), attn_mask))
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(windowed.F, "scaled_dot_product_attention", spy)
    out = kernels.attend(query, key, value, q_offset=q_offset, scaling=0.25, window=window)  # [B, Q, Hq, D]
    assert torch.allclose(out.transpose(1, 2).double(), windowed_eager(query, key, value, q_offset, 0.25, window),
                          atol=1e-6)
    assert len(calls) == -(-q_len // block)
    for index, (q_shape, keys, mask) in enumerate(calls):
        first = index * block
        rows = min(block, q_len - first)
        start, stop = max(0, q_offset + first - window + 1), q_offset + first + rows
        assert q_shape == (batch, num_k, 4 * rows, head_dim)  # query heads folded onto their KV head
        assert torch.equal(keys, key[:, :, start:stop])  # this block's visible keys, not repeated
        assert mask.dtype == query.dtype and mask.shape == (4 * rows, stop - start)
        assert mask.stride() == (16, 1) and stop - start <= rows + window - 1


def test_planner_counts_the_windowed_chunk_scratch():
    """Mistral-7B in bf16 at chunk 4096: the CUDA plan's attention covers the window route's temporaries (no
    longer K/V repeated for the query heads) beside the cache's scratch buffer (a group's visible K/V, which holds
    the blocks' contiguous copies), and a CPU plan's host memory adds them (the same model without a window, at
    a context that stores the same tokens, plans exactly that much less)."""
    from transformers import MistralConfig

    def shape(window):
        return ModelShape.from_config(MistralConfig(sliding_window=window), dtype_bytes=2, num_params=7 * 10**9)

    # (Buffers of one group: a run of several is attended in one call, its contiguous copy as many groups large.)
    policy = OffloadPolicy(chunk_size=4096, head_group_size=1, resident_slots=0, groups_per_buffer=1)
    plan = make_plan(shape(4096), policy, 2**20, device_is_cuda=True)
    temporaries = windowed.scratch_bytes(1, 4, 1, 128, 4096, 4096, 2, cuda=True, kv_in_scratch=True)
    contiguous = 2 * (4095 + 4096) * 128 * 2  # one KV head's keys and values over its window ring, unrepeated
    assert plan.allocations["scratch"] == contiguous
    assert plan.gpu_breakdown["attention"] == contiguous + temporaries
    assert temporaries < windowed.scratch_bytes(1, 4, 1, 128, 4096, 4096, 2, cuda=True)  # no block copies of its own
    cpu_policy = OffloadPolicy(chunk_size=4096)
    windowed_plan, full_plan = (make_plan(shape(w), cpu_policy, 4096, device_is_cuda=False) for w in (4096, None))
    group = windowed_plan.head_group_size
    assert windowed_plan.host_bytes - full_plan.host_bytes == windowed.scratch_bytes(
        1, 4 * group, group, 128, 4096, 4096, 2, cuda=False, cpu_threads=torch.get_num_threads())
