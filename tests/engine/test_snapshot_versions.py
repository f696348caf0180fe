"""Snapshots written before format version 5 (per-layer K/V shapes) still reopen exactly, and a uniform model's are
still written the way engines of version 3 and 4 read them.

The fixtures under ``fixtures/`` were written by the store before version 5: a complete read (version 3) and a read
checkpointed part-way (version 4) of the tiny ``llama-gqa`` of seed 1234 (built from its config, no folder: its
fingerprint is its config and weights alone) with ``test_snapshot``'s word tokenizer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from archs import tiny_configs
from checkpoint_reads import assert_same_read, chunked_session, read_outcome
from tiny_sessions import open_session, prefilled_session, word_tokenizer, words_text
from transformers import AutoModelForCausalLM

from engine import SnapshotStore
from engine.store.format import HEADER_FILE, read_header

FIXTURES = Path(__file__).parent / "fixtures"
DOCUMENTS = {"snapshot-v3": words_text(21, 40), "snapshot-v4": words_text(22, 60)}  # what each fixture read


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(tiny_configs()["llama-gqa"], attn_implementation="headinfer")
    return model.eval(), word_tokenizer()


def _store_holding(tmp_path: Path, fixture: str) -> SnapshotStore:
    store = SnapshotStore(tmp_path / "kv")
    shutil.copytree(FIXTURES / fixture, store.root / read_header(FIXTURES / fixture).key)
    return store


def test_a_version_3_snapshot_reopens_to_the_same_tokens_and_logits(tiny, tmp_path):
    model, tokenizer = tiny
    text = DOCUMENTS["snapshot-v3"]
    assert read_header(FIXTURES / "snapshot-v3").version == 3
    expected = read_outcome(prefilled_session(model, tokenizer, text))
    reopened = open_session(model, tokenizer, text)
    stats = reopened.restore_snapshot(_store_holding(tmp_path, "snapshot-v3"))
    assert stats is not None and reopened.is_prefilled, "the fixture no longer matches this model or tokenizer"
    assert_same_read(read_outcome(reopened), expected)


def test_a_version_4_partial_read_continues_to_the_same_tokens_and_logits(tiny, tmp_path):
    model, tokenizer = tiny
    text = DOCUMENTS["snapshot-v4"]
    header = read_header(FIXTURES / "snapshot-v4")
    assert header.version == 4 and header.num_read is not None
    reference = chunked_session(model, tokenizer, text)
    reference.prefill()
    expected = read_outcome(reference)
    reopened = chunked_session(model, tokenizer, text)
    stats = reopened.restore_snapshot(_store_holding(tmp_path, "snapshot-v4"))
    assert stats is not None and stats.num_tokens == header.num_read < reopened.document_tokens
    reopened.prefill()
    assert_same_read(read_outcome(reopened), expected)


def test_a_uniform_model_is_still_saved_as_version_3(tiny, tmp_path):
    model, tokenizer = tiny
    info = prefilled_session(model, tokenizer, DOCUMENTS["snapshot-v3"]).save_snapshot(SnapshotStore(tmp_path / "kv"))
    written = json.loads((info.path / HEADER_FILE).read_text())
    before = json.loads((FIXTURES / "snapshot-v3" / HEADER_FILE).read_text())
    assert written["version"] == 3 and written.keys() == before.keys()  # no per-layer fields: version 3 reads it
    assert [(f["name"], f["num_bytes"], f["crc32"]) for f in written["files"]] == [
        (f["name"], f["num_bytes"], f["crc32"]) for f in before["files"]]
