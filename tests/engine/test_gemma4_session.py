"""Gemma 4 through ``DocumentSession`` (the app's path): per-layer KV shapes in the sources pass, a saved read
(snapshot format version 5: each layer's KV heads and head_dim, no file for a KV-shared layer) reopens in a fresh
session to the same K/V, logits and greedy tokens, and the KV-shared layers' answers equal stock greedy."""

from __future__ import annotations

import pytest
import torch
from archs import tiny_configs
from checkpoint_reads import assert_same_read, read_outcome
from tiny_sessions import open_session, prefilled_session, tier_policy, word_tokenizer, words_text
from transformers import AutoModelForCausalLM

from engine import SnapshotStore
from engine.store.format import read_header

GEMMA4 = ["gemma4-head-dims", "gemma4-global-kv", "gemma4-shared-kv", "gemma4-published"]
#: How the document is read and how it is reopened: the same policy; one head a group on reopening (the file's
#: groups copied head by head: the planner groups two heads where every layer has two); the disk tier's homes linked.
READS = {"same": ({}, {}), "heads-apart": ({}, {"head_group_size": 1, "resident_slots": 0}), "disk-tier": (None, {})}


@pytest.fixture(scope="module", params=GEMMA4)
def gemma4(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(tiny_configs()[request.param]).save_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="headinfer")
    return request.param, folder, model.eval(), word_tokenizer()


def test_answers_carry_sources_naming_the_document(gemma4, caplog):
    name, _, model, tokenizer = gemma4
    session = prefilled_session(model, tokenizer, words_text(1))
    *_, last = session.ask("w3 w4 w5", max_new_tokens=8)
    assert "could not find retrieval heads" not in caplog.text
    assert last.sources and last.sources[0].page is None and last.sources[0].label().startswith("document"), name


@pytest.mark.parametrize("read", sorted(READS))
def test_a_saved_read_reopens_in_a_fresh_session_to_the_same_tokens_and_logits(gemma4, tmp_path, read):
    name, folder, model, tokenizer = gemma4
    text = words_text(2)
    reading_policy, reopening_policy = READS[read]
    if reading_policy is None:
        reading_policy = tier_policy(model, tokenizer, text, tmp_path)
    reading = prefilled_session(model, tokenizer, text, **reading_policy)
    assert read != "disk-tier" or reading.cache.kv_bytes()["disk"] > 0
    info = reading.save_snapshot(SnapshotStore(tmp_path / "kv"))
    expected, shape = read_outcome(reading), reading.cache.shape
    reading.clear()
    header = read_header(info.path)
    assert header.version == 5 and header.layer_shapes == tuple(zip(shape.kv_layer_indices, shape.kv_heads,
                                                                     shape.head_dims)), name
    assert not [f for consumer, _ in shape.shared_layers for f in info.path.glob(f"layer-{consumer:03d}*")]
    # A fresh session of the model loaded again, as the app after a restart.
    fresh = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="headinfer")
    reopened = open_session(fresh.eval(), tokenizer, text, **reopening_policy)
    stats = reopened.restore_snapshot(SnapshotStore(tmp_path / "kv"))
    assert stats is not None and stats.num_tokens == reopened.document_tokens and reopened.is_prefilled, name
    assert_same_read(read_outcome(reopened), expected)


@torch.inference_mode()
def test_answers_equal_stock_greedy(gemma4):
    name, folder, model, tokenizer = gemma4
    text, question = words_text(3), "w3 w4 w5"
    session = prefilled_session(model, tokenizer, text)
    ids = session.prompts.document_ids(text) + session.prompts.conversation_ids(text, [], question)
    stock = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()  # sdpa, in-memory K/V
    # An explicit mask: the prompt holds w0 (id 0, Gemma 4's pad id), which generate would otherwise mask out.
    out = stock.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=8, do_sample=False)
    expected = tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)
    *_, last = session.ask(question, max_new_tokens=8, repetition_guard=None)
    assert last.text.strip() == expected.strip(), name
