"""On a GPU: the allocation ledger against ``max_memory_allocated``, and the dry-run activation measurement.

Marked ``gpu``: skipped without CUDA (CI), run by ``python -m benchmarks.gpu.gpu_all`` on a lent GPU.
"""

from __future__ import annotations

import gc

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import engine
from engine.planning.machine import measure_activation_peak

pytestmark = pytest.mark.gpu

CONFIG = LlamaConfig(hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
                     num_key_value_heads=4, vocab_size=1000, max_position_embeddings=8192)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(CONFIG, attn_implementation="headinfer", dtype=torch.float16).cuda().eval()


@pytest.mark.parametrize("options", [{"resident_slots": 0}, {"resident_slots": 3}, {"kv_dtype": "int8", "resident_slots": 0}],
                         ids=["offloaded", "partial", "int8"])
@torch.inference_mode()
def test_ledger_holds_against_max_memory_allocated(model, options):
    chunk, context = 512, 4096
    activations = measure_activation_peak(model, chunk, CONFIG.vocab_size)
    assert activations and activations > 0
    # Nothing an earlier test left as garbage may be freed while this one measures from ``before``: a cache
    # collected mid-test (before the engine broke its reference cycle, the previous case's was) lowers the
    # allocator's count below the baseline, and the peak above it no longer covers this cache's buffers.
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    cache = engine.HeadInferCache(model.config, max_context=context, chunk_size=chunk, **options)
    ids = torch.randint(0, CONFIG.vocab_size, (1, context - 8), device="cuda")
    for start in range(0, ids.shape[1], chunk):
        model(ids[:, start : start + chunk], past_key_values=cache, use_cache=True, logits_to_keep=1)
    for _ in range(8):
        model(ids[:, :1], past_key_values=cache, use_cache=True)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    on_device = cache.ledger.peak(device="cuda")
    planned = cache.plan.allocations
    for category in planned:
        assert cache.ledger.peak(category) <= planned[category], (category, cache.ledger.peak(category),
                                                                  planned[category])
    # The device's peak holds the ledger's device buffers plus one chunk's activations and attention scratch.
    assert on_device <= peak <= on_device + activations + cache.plan.gpu_breakdown["attention"] + (64 << 20), \
        (on_device, peak, activations, cache.ledger.table())
    cache.release()


def test_host_attention_and_h2d_measured_together_on_cuda():
    from engine.planning.machine_rates import measure_h2d_gbps, measure_together_gbps

    host, link = measure_together_gbps(torch.device("cuda"), tokens=1 << 16, num_bytes=64 << 20)
    assert host > 0 and link > 0
    assert link <= 1.2 * measure_h2d_gbps(torch.device("cuda"), 64 << 20)  # sharing DRAM never speeds the link up


@torch.inference_mode()
def test_gpu_resident_homes_never_grow_past_a_fixed_plan(model):
    from engine.errors import HomesFull

    cache = engine.HeadInferCache(model.config, max_context=64, chunk_size=32)  # every slot resident
    ids = torch.randint(0, CONFIG.vocab_size, (1, 64), device="cuda")
    model(ids, past_key_values=cache, use_cache=True)
    held = cache.ledger.held("homes")
    with pytest.raises(HomesFull, match="max_context"):
        model(ids[:, :1], past_key_values=cache, use_cache=True)
    assert cache.ledger.held("homes") == held  # nothing was allocated
