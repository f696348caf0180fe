"""Qwen2.5-1M past 262,144 tokens: the engine reads on with full attention, exactly, where the model card reads with
Dual Chunk Attention; the header says plainly that answers degrade there (the picker ranks it by those tokens)."""

from __future__ import annotations

from transformers import AutoModelForCausalLM, Qwen2Config

from app import render
from engine.models import describe
from engine.planning.window import degrades_past

# Qwen2.5-7B-Instruct-1M's config.json carries this block (vLLM runs Dual Chunk Attention from it).
DUAL_CHUNK = {"chunk_size": 262144, "local_size": 8192, "original_max_position_embeddings": 262144}


def _tiny(**extra) -> Qwen2Config:
    return Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=97, max_position_embeddings=1010000, **extra)


def test_a_dual_chunk_model_says_its_answers_degrade_past_its_chunk():
    one_m = AutoModelForCausalLM.from_config(_tiny(dual_chunk_attention_config=DUAL_CHUNK))
    assert degrades_past(one_m.config) == 262144
    info = describe(one_m)
    assert info["degrades_past"] == 262144
    header = render.model_header(info)
    assert 'class="lossy">answers degrade past 262,144 tokens' in header and "Dual Chunk Attention" in header


def test_a_model_without_it_says_nothing_of_the_kind():
    plain = AutoModelForCausalLM.from_config(_tiny())
    assert degrades_past(plain.config) is None and describe(plain)["degrades_past"] is None
    assert "degrade" not in render.model_header(describe(plain))
