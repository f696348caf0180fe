"""The cache reaches a model's forward under the keyword its transformers takes: ``cache`` where ``past_key_values``
is deprecated (5.24 on, removed in 5.40), ``past_key_values`` before; the engine's own forwards warn about neither."""

from __future__ import annotations

import warnings

import torch

from engine import HeadInferCache, OffloadPolicy
from engine.cache import cache_argument
from engine.selfcheck.cases import TinyPair, greedy, greedy_stock


class _Old(torch.nn.Module):
    def forward(self, input_ids, past_key_values=None, use_cache=None):
        return input_ids


class _New(torch.nn.Module):
    def forward(self, input_ids, cache=None, use_cache=None):
        return input_ids


def test_the_keyword_follows_the_models_forward():
    assert cache_argument(_Old()) == "past_key_values"
    assert cache_argument(_New()) == "cache"
    assert cache_argument(object()) == "past_key_values"  # nothing to read: the long-standing name


def test_the_engines_forwards_warn_about_no_deprecated_keyword():
    pair = TinyPair.build("llama-gqa", torch.float32, torch.device("cpu"))
    cache = HeadInferCache(pair.headinfer.config, OffloadPolicy(chunk_size=8), device="cpu", max_context=64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stock_logits, stock_tokens = greedy_stock(pair)
        logits, tokens = greedy(pair.headinfer, pair, cache)
    assert not [str(w.message) for w in caught if "past_key_values" in str(w.message)]
    assert tokens == stock_tokens and torch.allclose(logits[-1], stock_logits[-1], rtol=1e-4, atol=1e-5)
