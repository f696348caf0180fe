"""Head-wise attention vs stock transformers, on every supported architecture (tiny random configs, fp32)."""

from __future__ import annotations

import math

import pytest
import torch
from archs import build_pair, longrope_past_original_config, tiny_configs
from parity import BF16_RTOL, PROMPT_LEN, RTOL, chunked_logits, prompt, rel_diff, stepwise_logits, stock_chunked
from transformers import DynamicCache

import engine
from engine.planning.shape import ModelShape


@pytest.fixture(scope="module", params=sorted(tiny_configs()))
def pair(request, tmp_path_factory):
    stock, headinfer = build_pair(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, stock, headinfer


@pytest.mark.parametrize("chunk", [1, 7, 16, PROMPT_LEN])
@pytest.mark.parametrize("resident_slots", [None, 0], ids=["on-device-homes", "ping-pong"])
@torch.inference_mode()
def test_chunked_prefill_matches_stock(pair, chunk, resident_slots):
    name, stock, headinfer = pair
    ids = prompt(stock.config.get_text_config().vocab_size)
    expected = stock_chunked(stock, ids, chunk)
    num_kv_heads = math.gcd(*ModelShape.from_config(stock.config).kv_heads)  # (a group divides every layer's)
    for group in [d for d in range(1, num_kv_heads + 1) if num_kv_heads % d == 0]:
        cache = engine.HeadInferCache(headinfer.config, head_group_size=group, resident_slots=resident_slots)
        actual = chunked_logits(headinfer, ids, cache, chunk)
        assert cache.get_seq_length() == PROMPT_LEN
        assert rel_diff(actual, expected) < RTOL, (name, chunk, group)


@pytest.mark.parametrize("resident_slots", [None, 0, 2], ids=["on-device-homes", "ping-pong", "mixed"])
@torch.inference_mode()
def test_decode_matches_stock(pair, resident_slots):
    name, stock, headinfer = pair
    ids = prompt(stock.config.get_text_config().vocab_size)
    stock_cache = DynamicCache(config=stock.config)
    expected = [stock(ids, past_key_values=stock_cache, use_cache=True).logits[:, -1]]
    cache = engine.HeadInferCache(headinfer.config, head_group_size=1, resident_slots=resident_slots, chunk_size=16)
    actual = [chunked_logits(headinfer, ids, cache, 16)[:, -1]]
    for _ in range(12):  # past the window: decode must slide it too
        token = expected[-1].argmax(-1, keepdim=True)
        expected.append(stock(token, past_key_values=stock_cache, use_cache=True).logits[:, -1])
        actual.append(headinfer(token, past_key_values=cache, use_cache=True).logits[:, -1])
    for step, (a, e) in enumerate(zip(actual, expected)):
        assert rel_diff(a, e) < RTOL, (name, step)


@torch.inference_mode()
def test_generate_greedy_tokens_identical(pair):
    name, stock, headinfer = pair
    ids = prompt(stock.config.get_text_config().vocab_size)
    kwargs = dict(max_new_tokens=20, do_sample=False, min_new_tokens=20)
    expected = stock.generate(ids, **kwargs)
    cache = engine.HeadInferCache(headinfer.config, resident_slots=0)
    actual = headinfer.generate(ids, past_key_values=cache, prefill_chunk_size=16, **kwargs)
    assert torch.equal(actual, expected), name
    assert cache.get_seq_length() == PROMPT_LEN + 20 - 1  # the last token is returned, not fed back


@torch.inference_mode()
def test_headinfer_attention_without_headinfer_cache(pair):
    """The registered function also serves a stock DynamicCache (or none): same kernels, same results."""
    name, stock, headinfer = pair
    ids = prompt(stock.config.get_text_config().vocab_size)
    assert rel_diff(headinfer(ids).logits, stock(ids).logits) < RTOL


@torch.inference_mode()
def test_longrope_long_factors_match_stock(tmp_path):
    """Phi-3 past its original window: the long factors apply, in prefill and every decode step."""
    stock, headinfer = build_pair("phi3-long", tmp_path, config=longrope_past_original_config())
    ids = prompt(stock.config.get_text_config().vocab_size)  # 45 tokens > the original window of 32
    assert ids.shape[1] > stock.config.rope_parameters["original_max_position_embeddings"]
    kwargs = dict(max_new_tokens=20, do_sample=False, min_new_tokens=20, output_logits=True,
                  return_dict_in_generate=True)
    expected = stock.generate(ids, **kwargs)
    actual = headinfer.generate(ids, past_key_values=engine.HeadInferCache(headinfer.config, resident_slots=0), **kwargs)
    assert torch.equal(actual.sequences, expected.sequences)
    for step, (a, e) in enumerate(zip(actual.logits, expected.logits)):
        assert rel_diff(a, e) < RTOL, step


@pytest.fixture(scope="module", params=sorted(tiny_configs()))
def bf16_pair(request, tmp_path_factory):
    stock, headinfer = build_pair(request.param, tmp_path_factory.mktemp(f"{request.param}-bf16"), dtype=torch.bfloat16)
    return request.param, stock, headinfer


@torch.inference_mode()
def test_bf16_weights_on_cpu_match_stock_bf16(bf16_pair):
    """CPU weights in bf16 (``load_model(dtype="bfloat16")``): the same bf16 weights in stock transformers give
    the same logits within bf16 rounding, prefill and decode, and the same greedy tokens."""
    name, stock, headinfer = bf16_pair
    assert next(headinfer.parameters()).dtype == torch.bfloat16 and next(headinfer.parameters()).device.type == "cpu"
    ids = prompt(stock.config.get_text_config().vocab_size)
    actual, expected = stepwise_logits(stock, headinfer, ids)
    for step, (a, e) in enumerate(zip(actual, expected)):
        assert rel_diff(a.float(), e.float()) < BF16_RTOL, (name, step)
    kwargs = dict(max_new_tokens=20, do_sample=False, min_new_tokens=20)
    generated = headinfer.generate(ids, past_key_values=engine.HeadInferCache(headinfer.config, resident_slots=0),
                                   **kwargs)
    assert torch.equal(generated, stock.generate(ids, **kwargs)), name


def test_every_supported_family_is_in_the_grid():
    """A family listed as supported without a tiny config here would be served unproven."""
    from engine.models.loader import SUPPORTED_ARCHITECTURES

    # A published wrapper's text model is the class its text-only checkpoints load (Qwen3.5-MoE's, say).
    covered = {kind for config in tiny_configs().values()
               for kind in (config.model_type, config.get_text_config().model_type)}
    assert set(SUPPORTED_ARCHITECTURES) - {"gemma3"} <= covered  # gemma3: a wrapper loaded as gemma3_text


def _windowed_names() -> list[str]:
    # Families with a window shorter than the prompt (Mistral-Nemo's config keeps Mistral's 4096: never reached).
    return sorted(name for name, config in tiny_configs().items()
                  if any(w is not None and w < PROMPT_LEN for w in ModelShape.from_config(config).sliding_windows))


# Gemma 4's tiny random configs in bf16 move by more than BF16_RTOL between two summation orders in stock itself
# (its chunked read vs its whole one: 0.03; its bf16 vs its fp32: 0.12), so their query blocks are checked in fp32.
@pytest.fixture(scope="module", params=[(name, dtype) for name in _windowed_names()
                                        for dtype in (torch.float32, torch.bfloat16)
                                        if not (name.startswith("gemma4") and dtype == torch.bfloat16)],
                ids=lambda param: f"{param[0]}-{str(param[1]).removeprefix('torch.')}")
def windowed_pair(request, tmp_path_factory):
    name, dtype = request.param
    stock, headinfer = build_pair(name, tmp_path_factory.mktemp(f"{name}-blocks"), dtype=dtype)
    return name, dtype, stock, headinfer


@torch.inference_mode()
def test_windowed_chunks_in_query_blocks_match_stock(windowed_pair, monkeypatch):
    """Every windowed family with a mask budget of a few queries, so each chunk past the C tile's 16 queries
    attends in several blocks (``kv.windowed``): prefill logits at every position within the tolerance (chunks of
    20 and the whole prompt, through a head-wise cache and without one), greedy tokens identical."""
    from engine.kv import kernels, windowed

    name, dtype, stock, headinfer = windowed_pair
    assert _windowed_names() == ["cohere2-window", "gemma2-softcap", "gemma3-window", "gemma4-global-kv",
                                 "gemma4-head-dims", "gemma4-published", "gemma4-shared-kv", "mistral-window",
                                 "olmo3-window", "qwen2-window"]
    monkeypatch.setattr(windowed, "MASK_BYTES", 640)  # 2 query heads per KV head: 5 fp32 / 9 bf16 queries a block
    assert windowed.query_block(2, 8, torch.finfo(dtype).bits // 8, PROMPT_LEN) in (5, 9)
    tolerance = RTOL if dtype == torch.float32 else BF16_RTOL
    ids = prompt(stock.config.get_text_config().vocab_size)
    expected = stock(ids).logits.float()
    kernels.ROUTE_COUNTS.clear()
    for chunk in (20, PROMPT_LEN):
        cache = engine.HeadInferCache(headinfer.config, head_group_size=1, resident_slots=0)
        assert rel_diff(chunked_logits(headinfer, ids, cache, chunk).float(),
                        stock_chunked(stock, ids, chunk).float()) < tolerance, (name, chunk)
    assert rel_diff(headinfer(ids).logits.float(), expected) < tolerance, name
    # Gemma 2's softcap takes the tiled route, whose query blocks are tested apart; every other family ran here.
    assert (kernels.ROUTE_COUNTS["window-blocks"] > 0) != name.startswith("gemma2"), dict(kernels.ROUTE_COUNTS)
    kwargs = dict(max_new_tokens=20, do_sample=False, min_new_tokens=20)
    cache = engine.HeadInferCache(headinfer.config, resident_slots=0)
    generated = headinfer.generate(ids, past_key_values=cache, prefill_chunk_size=20, **kwargs)
    assert torch.equal(generated, stock.generate(ids, **kwargs)), name
