"""Gemma 4 through ``DocumentSession`` (the app's path): per-layer KV shapes in the sources pass, snapshots refused
up front for layers of differing shapes or shared K/V (nothing written), and the KV-shared layers' answers equal
stock greedy."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from archs import tiny_configs
from engine import SnapshotStore
from engine.errors import SnapshotError
from test_snapshot import _document, _prefilled, _word_tokenizer

GEMMA4 = ["gemma4-head-dims", "gemma4-global-kv", "gemma4-shared-kv"]


@pytest.fixture(scope="module", params=GEMMA4)
def gemma4(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(tiny_configs()[request.param]).save_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="headinfer")
    return request.param, folder, model.eval(), _word_tokenizer()


def test_answers_carry_sources_naming_the_document(gemma4, caplog):
    name, _, model, tokenizer = gemma4
    session = _prefilled(model, tokenizer, _document(1))
    *_, last = session.ask("w3 w4 w5", max_new_tokens=8)
    assert "could not find retrieval heads" not in caplog.text
    assert last.sources and last.sources[0].page is None and last.sources[0].label().startswith("document"), name


def test_a_snapshot_is_refused_with_the_reason_and_nothing_written(gemma4, tmp_path, caplog):
    _, _, model, tokenizer = gemma4
    store = SnapshotStore(tmp_path / "kv")
    session = _prefilled(model, tokenizer, _document(2))
    with pytest.raises(SnapshotError, match="cannot be saved for instant reopening"):
        session.save_snapshot(store)
    assert "not saving a snapshot" in caplog.text
    assert store.list() == [] and not any((tmp_path / "kv").glob("*/*"))
    assert session.restore_snapshot(store) is None


@torch.inference_mode()
def test_answers_equal_stock_greedy(gemma4):
    name, folder, model, tokenizer = gemma4
    text, question = _document(3), "w3 w4 w5"
    session = _prefilled(model, tokenizer, text)
    ids = session.prompts.document_ids(text) + session.prompts.conversation_ids(text, [], question)
    stock = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()  # sdpa, in-memory K/V
    # An explicit mask: the prompt holds w0 (id 0, Gemma 4's pad id), which generate would otherwise mask out.
    out = stock.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=8, do_sample=False)
    expected = tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)
    *_, last = session.ask(question, max_new_tokens=8, repetition_guard=None)
    assert last.text.strip() == expected.strip(), name
