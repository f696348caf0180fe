"""Switching the served model: the old one's memory comes back, its open documents close with a note."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

import engine  # noqa: F401  (registers the headinfer attention)
from engine.serving import ModelHolder, _rss
from engine.planning.policy import OffloadPolicy

VOCAB = 32000


def _tokenizer():
    raw = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="w0", eos_token="w1")


def _model(hidden: int):
    """Random Llama; at hidden 2048 its untied embeddings alone are 2 x 32000 x 2048 fp32 = 0.49 GiB."""
    config = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=8,
                         num_key_value_heads=4, vocab_size=VOCAB, tie_word_embeddings=False,
                         max_position_embeddings=4096)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="headinfer").eval()


def test_switch_returns_the_old_models_memory_and_closes_open_documents():
    tokenizer = _tokenizer()
    big = _model(2048)
    weights = sum(p.numel() * p.element_size() for p in big.parameters())
    big_ref = weakref.ref(big)
    holder = ModelHolder(big, tokenizer, OffloadPolicy(chunk_size=64), "big", loader=lambda _: (_model(64), tokenizer))
    del big
    reading = holder.new_session()
    reading.set_document(" ".join(f"w{i % 97 + 2}" for i in range(200)))
    reading.prefill()
    idle = holder.new_session()
    before = holder.info()

    report = holder.switch("tiny", name="tiny")

    gc.collect()
    assert big_ref() is None, "something still holds the old model"
    assert report.closed_documents == 1 and report.old == "big" and report.new == "tiny"
    assert report.returned_bytes > 0.7 * weights  # measured RSS, not a promise
    for session in (reading, idle):
        assert "switched from big to tiny" in session.retired and session.model is None
    assert not reading.is_prefilled
    for session in (reading, idle):  # a tab closing later clears it again (app: unload, the state's delete, working)
        session.clear()
        assert session.model is None and not session.document
    after = holder.info()  # what the app's header shows: the new model, under a new serial
    assert (before["serial"], after["serial"]) == (0, 1) and after["params"] < before["params"]
    fresh = holder.new_session()
    assert fresh.model is holder.model and fresh.retired is None
    fresh.set_document("w5 w6 w7")
    fresh.prefill()
    assert fresh.is_prefilled


def test_a_failed_load_leaves_the_old_model_serving():
    tokenizer = _tokenizer()

    def fail(_):
        raise OSError("no such model")

    holder = ModelHolder(_model(64), tokenizer, OffloadPolicy(chunk_size=64), "old", loader=fail)
    session = holder.new_session()
    with pytest.raises(OSError):
        holder.switch("missing")
    assert holder.name == "old" and session.retired is None and session.model is holder.model
    assert _rss() > 0
