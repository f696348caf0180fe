"""CPU decode attention through the C tile (route ``cpu-native``, ``engine.kv.kernels``): the same attention as the
SDPA route on token-major blocks, every mask and shape, and the route a CPU fp32 model's decode steps take."""

from __future__ import annotations

import pytest
import torch

import engine
from archs import build_pair
from engine.kv import kernels, native

pytestmark = pytest.mark.skipif(native.kernel() is None, reason="no C compiler here: SDPA runs CPU decode")


def sdpa_reference(query, block, q_offset, scaling, window, softcap):
    """[B, Hq, Q, D] by the route the C tile replaces: SDPA (or the tiled softcap path) on the block's views."""
    keys, values = block.permute(2, 1, 3, 0, 4).unbind(0)
    return kernels._attend(query, keys, values, q_offset, scaling, window, softcap)


@pytest.mark.parametrize("window, softcap", [(None, None), (7, None), (None, 2.0), (9, 3.0)],
                         ids=["full", "window", "softcap", "window-softcap"])
@pytest.mark.parametrize("q_len", [1, 5, native.CPU_QUERY_LIMIT])
@pytest.mark.parametrize("batch, num_kv_heads, n_rep, dim, keys", [(1, 3, 3, 64, 1100), (2, 2, 2, 16, 45),
                                                                   (1, 4, 1, 128, 600), (1, 1, 8, 32, 513)],
                         ids=["gqa-smollm2", "batch-2", "mha-128", "mqa-block-edge"])
def test_tile_equals_sdpa_on_a_block(window, softcap, q_len, batch, num_kv_heads, n_rep, dim, keys):
    torch.manual_seed(0)
    block = torch.randn(keys, batch, 2, num_kv_heads, dim)
    # transformers hands attention a transposed view: [B, Q, H, D] storage read as [B, H, Q, D]
    query = torch.randn(batch, q_len, num_kv_heads * n_rep, dim).transpose(1, 2)
    saved = torch.get_num_threads()
    torch.set_num_threads(1)  # the calling thread's route, whatever the runner's threads (the pool's test is below)
    try:
        before = kernels.ROUTE_COUNTS["cpu-native"]
        out = kernels.attend_span(query, block, q_offset=keys - q_len, scaling=dim**-0.5, window=window,
                                   softcap=softcap)
        assert kernels.ROUTE_COUNTS["cpu-native"] == before + 1
    finally:
        torch.set_num_threads(saved)
    expected = sdpa_reference(query, block, keys - q_len, dim**-0.5, window, softcap)
    assert out.shape == expected.shape and out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_queries_are_not_changed():
    """The tile folds the scale into a copy of the queries, never into the caller's tensor."""
    block, query = torch.randn(40, 1, 2, 2, 16), torch.randn(1, 4, 1, 16)
    kept = query.clone()
    kernels.attend_span(query, block, q_offset=39, scaling=0.25)
    assert torch.equal(query, kept)


def test_large_blocks_split_over_the_pool_give_the_same_result(monkeypatch):
    monkeypatch.setattr(kernels, "POOL_BYTES", 0)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(1)
        block, query = torch.randn(3000, 1, 2, 3, 64), torch.randn(1, 9, 1, 64)
        before = kernels.ROUTE_COUNTS["cpu-native-pool"]
        out = kernels.attend_span(query, block, q_offset=2999, scaling=0.125)
        assert kernels.ROUTE_COUNTS["cpu-native-pool"] == before + 1
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(out, sdpa_reference(query, block, 2999, 0.125, None, None), rtol=1e-5, atol=1e-6)


def test_bf16_keeps_sdpa():
    """bf16 queries, a decode step or a prefill chunk: torch's CPU SDPA rounds probabilities to bf16 with its own
    exp, and a bf16 model's greedy tokens must stay those of stock transformers."""
    block = torch.randn(100, 1, 2, 2, 16).bfloat16()
    before = kernels.ROUTE_COUNTS.copy()
    kernels.attend_span(torch.randn(1, 4, 1, 16).bfloat16(), block, q_offset=99, scaling=0.25)
    kernels.attend_span(torch.randn(1, 4, 40, 16).bfloat16(), block, q_offset=60, scaling=0.25)
    assert all(kernels.ROUTE_COUNTS[route] == before[route]
               for route in ("cpu-native", "cpu-native-pool", "cpu-native-prefill"))


@pytest.mark.parametrize("window, softcap", [(None, None), (7, None), (None, 2.0), (90, 3.0)],
                         ids=["full", "window", "softcap", "window-softcap"])
@pytest.mark.parametrize("q_len, keys", [(native.CPU_QUERY_LIMIT + 1, 17), (150, 150), (150, 700)],
                         ids=["just-over-the-limit", "first-chunk", "later-chunk"])
@pytest.mark.parametrize("threads", [1, 2])
def test_prefill_chunks_take_the_kernel_a_query_block_a_call_as_sdpa_computes_them(window, softcap, q_len, keys,
                                                                                    threads):
    """A chunk of more than CPU_QUERY_LIMIT fp32 queries: the C kernel, ``PREFILL_QUERY_BLOCK`` queries a call over
    the keys they see (150 queries: two whole blocks and a remainder), on one thread and on the pool, within fp32
    rounding of the SDPA route (or the tiled softcap one) it replaces; GQA folded, a batch of 2."""
    torch.manual_seed(0)
    block = torch.randn(keys, 2, 2, 3, 64)  # [K, B, 2, Hk, D]
    query = torch.randn(2, q_len, 3 * 4, 64).transpose(1, 2)  # [B, H, Q, D] as transformers hands it
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        before = kernels.ROUTE_COUNTS["cpu-native-prefill"]
        out = kernels.attend_span(query, block, q_offset=keys - q_len, scaling=0.125, window=window,
                                   softcap=softcap)
        assert kernels.ROUTE_COUNTS["cpu-native-prefill"] == before + 1
    finally:
        torch.set_num_threads(saved)
    expected = sdpa_reference(query, block, keys - q_len, 0.125, window, softcap)
    assert out.shape == expected.shape and out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


@torch.inference_mode()
def test_a_cpu_model_decodes_through_the_tile_with_stock_tokens(tmp_path):
    stock, model = build_pair("mistral-window", tmp_path)
    ids = torch.randint(0, stock.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(3))
    before = kernels.ROUTE_COUNTS["cpu-native"]
    kwargs = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False)
    generated = model.generate(ids, past_key_values=engine.HeadInferCache(model.config, chunk_size=16), **kwargs)
    steps = kernels.ROUTE_COUNTS["cpu-native"] - before
    assert steps >= 11 * model.config.num_hidden_layers  # every decode step, every layer
    assert torch.equal(generated, stock.generate(ids, **kwargs))
