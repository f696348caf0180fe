"""Head-wise attention vs stock transformers on CUDA: every tiny architecture in fp32 and bf16, through the
ping-pong buffers and side streams (``resident_slots=0``), with and without overlap; and the GPU peak of a
Llama-3-8B-shaped model at 32K/64K/128K tokens, head-wise vs stock, recorded with the benchmarks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

import engine
from archs import build_pair, tiny_configs

pytestmark = pytest.mark.gpu

PROMPT_LEN = 45  # longer than the sliding windows (8), not a multiple of the chunk size
CHUNK = 16
RTOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def rel_diff(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.float() - expected.float()).abs().max() / expected.float().abs().max())


@pytest.fixture(scope="module", params=[(n, d) for n in sorted(tiny_configs()) for d in (torch.float32, torch.bfloat16)],
                ids=lambda p: f"{p[0]}-{str(p[1]).removeprefix('torch.')}")
def pair(request, tmp_path_factory):
    name, dtype = request.param
    stock, headinfer = build_pair(name, tmp_path_factory.mktemp(name), dtype=dtype, device="cuda")
    return name, dtype, stock, headinfer


def prompt(vocab_size: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(7)).cuda()


def chunked_logits(model, ids, cache, chunk=CHUNK):
    return torch.cat([model(ids[:, s : s + chunk], past_key_values=cache, use_cache=True).logits
                      for s in range(0, ids.shape[1], chunk)], dim=1)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
@torch.inference_mode()
def test_pingpong_prefill_matches_stock_for_every_group_size(pair, overlap):
    name, dtype, stock, headinfer = pair
    ids = prompt(stock.config.vocab_size)
    expected = stock(ids).logits
    for group in [d for d in range(1, stock.config.num_key_value_heads + 1) if stock.config.num_key_value_heads % d == 0]:
        cache = engine.HeadInferCache(headinfer.config, device="cuda", head_group_size=group, resident_slots=0,
                                      overlap=overlap, chunk_size=CHUNK)
        actual = chunked_logits(headinfer, ids, cache)
        assert cache.kv_bytes()["host"] > 0  # the homes really are in host memory
        assert rel_diff(actual, expected) < RTOL[dtype], (name, dtype, group, overlap)


@pytest.mark.parametrize("resident_slots", [0, 2], ids=["ping-pong", "mixed"])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
@torch.inference_mode()
def test_decode_matches_stock(pair, resident_slots, overlap):
    name, dtype, stock, headinfer = pair
    ids = prompt(stock.config.vocab_size)
    stock_cache = DynamicCache(config=stock.config)
    expected = [stock(ids, past_key_values=stock_cache, use_cache=True).logits[:, -1]]
    cache = engine.HeadInferCache(headinfer.config, device="cuda", head_group_size=1, resident_slots=resident_slots,
                                  overlap=overlap, chunk_size=CHUNK)
    actual = [chunked_logits(headinfer, ids, cache)[:, -1]]
    for _ in range(12):  # past the sliding windows
        token = expected[-1].argmax(-1, keepdim=True)
        expected.append(stock(token, past_key_values=stock_cache, use_cache=True).logits[:, -1])
        actual.append(headinfer(token, past_key_values=cache, use_cache=True).logits[:, -1])
    for step, (a, e) in enumerate(zip(actual, expected)):
        assert rel_diff(a, e) < RTOL[dtype], (name, dtype, step, resident_slots, overlap)


@torch.inference_mode()
def test_greedy_tokens_identical_in_fp32(pair):
    name, dtype, stock, headinfer = pair
    if dtype != torch.float32:
        pytest.skip("bf16 rounding may flip a near-tie argmax; tokens are compared in fp32")
    ids = prompt(stock.config.vocab_size)
    kwargs = dict(max_new_tokens=20, min_new_tokens=20, do_sample=False)
    expected = stock.generate(ids, **kwargs)
    for overlap in (True, False):
        cache = engine.HeadInferCache(headinfer.config, device="cuda", resident_slots=0, overlap=overlap)
        actual = headinfer.generate(ids, past_key_values=cache, prefill_chunk_size=CHUNK, **kwargs)
        assert torch.equal(actual, expected), (name, overlap)


# -- GPU peak of a Llama-3-8B-shaped model -------------------------------------------------------
PEAK_CONTEXTS = (32768, 65536, 131072)


def _results_path() -> Path:
    if os.environ.get("BENCH_RESULTS"):
        return Path(os.environ["BENCH_RESULTS"])
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / "gpu.json"
    return Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "data" / "gpu-peak-test.json"


def test_llama3_8b_peak_stays_flat_headwise_and_grows_with_stock():
    import psutil

    from benchmarks.harness.modes import GPU_MODES, Runner
    from benchmarks.harness.models import build_model
    from benchmarks.harness.probes import frontier
    from benchmarks.records import ResultStore, run_stamp

    model = build_model("llama3-8b", "cuda")
    runner = Runner(model, torch.device("cuda"), chunk_size=4096,
                    host_budget=int(psutil.virtual_memory().available * 0.7))
    store = ResultStore(_results_path(), run_stamp("cuda") | {"model": runner.describe("llama3-8b")})
    peaks = {}
    for mode in (GPU_MODES["chunked"], GPU_MODES["headinfer-g1"]):
        for context in PEAK_CONTEXTS:
            metrics = frontier(runner, mode, context, real_run_seconds=0.0)  # filled cache + last chunk + 1 step
            store.append("peak-test", mode.name, context=context, **metrics)
            assert metrics["status"] == "ok", (mode.name, context, metrics.get("reason"))
            peaks[mode.name, context] = max(metrics["prefill_peak_allocated"], metrics["decode_peak_allocated"])
            if mode.is_headinfer:
                planned = metrics["planned_gpu_bytes"]
                assert abs(peaks[mode.name, context] - planned) / planned < 0.10, (context, peaks, planned)
    first, last = PEAK_CONTEXTS[0], PEAK_CONTEXTS[-1]
    stock_growth = peaks["chunked", last] - peaks["chunked", first]
    headwise_growth = peaks["headinfer-g1", last] - peaks["headinfer-g1", first]
    assert stock_growth > 0.9 * (last - first) * runner.shape.kv_bytes_per_token  # the whole KV on the GPU
    assert headwise_growth < 0.05 * stock_growth  # two single-head buffers instead
    for context in PEAK_CONTEXTS:
        assert peaks["headinfer-g1", context] < peaks["chunked", context]
