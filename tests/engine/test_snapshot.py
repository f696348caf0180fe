"""KV-cache snapshots: save -> restore gives the same K/V and answers; damaged or foreign snapshots are refused.

The format and integrity tests use a tiny random Llama with a word-level tokenizer (fast); the slow
test reads a ~4K-token document with the real SmolLM2 once, saves it, and restores it in a new session.
"""

from __future__ import annotations

import copy
import errno
import logging
import os
import random
import time
from pathlib import Path

import pytest
import torch
from tiny_sessions import (
    VOCAB,
    answer_text,
    head_kv_bytes,
    open_session,
    prefilled_session,
    tiny_model,
    word_tokenizer,
    words_text,
)

from engine import DocumentSession, OffloadPolicy, SnapshotStore
from engine.errors import CorruptSnapshotError, SnapshotError
from engine.store import streaming as snapshot_io
from engine.store.format import HEADER_FILE, layer_file


@pytest.fixture
def store(tmp_path):
    return SnapshotStore(tmp_path / "kv")


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(data)


# -- save -> restore -----------------------------------------------------------------------------
@pytest.mark.parametrize("group", [1, 2], ids=["group-1", "group-2"])
def test_restore_gives_identical_kv_and_answers(tiny, store, group):
    model, tokenizer = tiny
    text = words_text(1)
    original = prefilled_session(model, tokenizer, text)
    expected_answer = answer_text(original)
    info = original.save_snapshot(store)
    assert info is not None and info.num_tokens == original.document_tokens and info.num_bytes > 0

    restored = open_session(model, tokenizer, text, head_group_size=group, resident_slots=0)
    stats = restored.restore_snapshot(store)
    assert stats is not None and stats.num_tokens == original.document_tokens and stats.gb_per_second > 0
    assert restored.is_prefilled and restored.cache.get_seq_length() == original.document_tokens
    assert all(torch.equal(a, b) for a, b in zip(head_kv_bytes(original), head_kv_bytes(restored)))
    assert answer_text(restored) == expected_answer
    assert [s.key for s in store.list()] == [info.key]


def test_find_only_matches_this_document(tiny, store):
    model, tokenizer = tiny
    prefilled_session(model, tokenizer, words_text(1)).save_snapshot(store)
    assert open_session(model, tokenizer, words_text(1)).find_snapshot(store) is not None
    other = open_session(model, tokenizer, words_text(2))
    assert other.find_snapshot(store) is None
    assert other.restore_snapshot(store) is None and not other.is_prefilled


def test_saving_again_keeps_the_snapshot(tiny, store):
    model, tokenizer = tiny
    session = prefilled_session(model, tokenizer, words_text(1))
    first = session.save_snapshot(store)
    again = session.save_snapshot(store)
    assert again.key == first.key and again.created == first.created and len(store.list()) == 1


def test_bfloat16_round_trip(tmp_path, store):
    model = tiny_model(tmp_path / "bf16", dtype=torch.bfloat16)
    tokenizer = word_tokenizer()
    original = prefilled_session(model, tokenizer, words_text(3))
    original.save_snapshot(store)
    restored = open_session(model, tokenizer, words_text(3))
    assert restored.restore_snapshot(store) is not None
    assert all(torch.equal(a, b) for a, b in zip(head_kv_bytes(original), head_kv_bytes(restored)))


# -- damaged snapshots ---------------------------------------------------------------------------
@pytest.fixture
def two_saved(tiny, store):
    """Snapshots of two documents; the tests damage the first and check the second still loads."""
    model, tokenizer = tiny
    first, second = words_text(1), words_text(2)
    return (prefilled_session(model, tokenizer, first).save_snapshot(store), first), (prefilled_session(model, tokenizer, second).save_snapshot(store), second)


def _check_damage_refused(tiny, store, two_saved, damage, message: str, caplog) -> None:
    model, tokenizer = tiny
    (info, text), (other_info, other_text) = two_saved
    damage(info.path)
    session = open_session(model, tokenizer, text)
    with pytest.raises(CorruptSnapshotError, match=message):
        store.restore(session.cache, session.snapshot_identity())
    assert not session.is_prefilled and session.cache.get_seq_length() == 0
    with caplog.at_level(logging.WARNING):
        assert session.restore_snapshot(store) is None
    assert message in caplog.text and "deleting it" in caplog.text
    assert not info.path.exists(), "a damaged snapshot is deleted"
    session.prefill()  # the fallback works on the emptied cache
    assert session.is_prefilled
    assert [s.key for s in store.list()] == [other_info.key], "nothing else in the store is harmed"
    assert open_session(model, tokenizer, other_text).restore_snapshot(store) is not None


def test_truncated_file_is_refused(tiny, store, two_saved, caplog):
    def truncate(folder):
        path = folder / layer_file(1)
        os.truncate(path, path.stat().st_size - 10)

    _check_damage_refused(tiny, store, two_saved, truncate, "truncated", caplog)


def test_flipped_byte_is_refused(tiny, store, two_saved, caplog):
    def flip(folder):
        path = folder / layer_file(2)
        _flip_byte(path, path.stat().st_size // 2)

    _check_damage_refused(tiny, store, two_saved, flip, "does not match its checksum", caplog)


def test_altered_header_is_refused(tiny, store, two_saved, caplog):
    def alter(folder):
        path = folder / HEADER_FILE
        path.write_text(path.read_text().replace('"num_tokens": ', '"num_tokens": 1', 1))

    _check_damage_refused(tiny, store, two_saved, alter, "header does not match its checksum", caplog)


def test_missing_file_is_refused(tiny, store, two_saved, caplog):
    _check_damage_refused(tiny, store, two_saved, lambda folder: (folder / layer_file(0)).unlink(), "missing", caplog)


# -- foreign snapshots ---------------------------------------------------------------------------
def _check_foreign_refused(store, saved_key: str, session: DocumentSession, message: str) -> None:
    assert session.find_snapshot(store) is None, "the key already tells a foreign snapshot apart"
    with pytest.raises(SnapshotError, match=message) as caught:
        store.restore(session.cache, session.snapshot_identity(), saved_key)
    assert not isinstance(caught.value, CorruptSnapshotError)
    assert not session.is_prefilled and session.cache.get_seq_length() == 0
    assert [s.key for s in store.list()] == [saved_key], "a foreign snapshot is kept for its own model"


def test_other_model_is_refused(tiny, store, tmp_path):
    model, tokenizer = tiny
    info = prefilled_session(model, tokenizer, words_text(1)).save_snapshot(store)
    other = tiny_model(tmp_path / "other", seed=99)
    _check_foreign_refused(store, info.key, open_session(other, tokenizer, words_text(1)), "another model .*other weights")


def test_other_dtype_is_refused(tiny, store):
    model, tokenizer = tiny
    info = prefilled_session(model, tokenizer, words_text(1)).save_snapshot(store)
    half = copy.deepcopy(model).to(torch.bfloat16)
    _check_foreign_refused(store, info.key, open_session(half, tokenizer, words_text(1)),
                           "holds float32 K/V but this model runs in bfloat16")


def test_other_weights_mode_is_refused(tiny, store):
    """int8 weights (``engine.cpu.int8``) and dense bf16 weights give bf16 K/V alike, but not the same K/V."""
    from engine.cpu.int8 import quantize_int8

    model, tokenizer = tiny
    dense = copy.deepcopy(model).to(torch.bfloat16)
    int8 = copy.deepcopy(model)
    quantize_int8(int8)
    info = prefilled_session(dense, tokenizer, words_text(1)).save_snapshot(store)
    _check_foreign_refused(store, info.key, open_session(int8, tokenizer, words_text(1)),
                           "another model .*dense weights, not int8")
    saved = prefilled_session(int8, tokenizer, words_text(1)).save_snapshot(store)
    assert saved.key != info.key
    again = copy.deepcopy(model)
    quantize_int8(again)
    assert open_session(again, tokenizer, words_text(1)).find_snapshot(store).key == saved.key, "int8 reopens int8"


def test_other_tokenizer_is_refused(tiny, store):
    model, tokenizer = tiny
    info = prefilled_session(model, tokenizer, words_text(1)).save_snapshot(store)
    shuffled = list(range(VOCAB))
    random.Random(5).shuffle(shuffled)
    _check_foreign_refused(store, info.key, open_session(model, word_tokenizer(shuffled), words_text(1)), "another tokenizer")


def test_other_document_is_refused(tiny, store):
    model, tokenizer = tiny
    info = prefilled_session(model, tokenizer, words_text(1)).save_snapshot(store)
    _check_foreign_refused(store, info.key, open_session(model, tokenizer, words_text(2)), "another document")


# -- atomic writes and the store -----------------------------------------------------------------
def test_write_failure_leaves_nothing(tiny, store, monkeypatch):
    model, tokenizer = tiny
    session = prefilled_session(model, tokenizer, words_text(1))
    written = 0
    real_write_all = snapshot_io._write_all

    def fail_after_some_bytes(file, view):
        nonlocal written
        if written + len(view) > 50_000:
            raise OSError(errno.ENOSPC, "No space left on device")
        written += len(view)
        real_write_all(file, view)

    monkeypatch.setattr(snapshot_io, "_write_all", fail_after_some_bytes)
    with pytest.raises(OSError) as caught:
        session.save_snapshot(store)
    assert caught.value.errno == errno.ENOSPC and written > 0, "the failure came part-way through"
    assert list(store.root.iterdir()) == [], "no partial files are left behind"
    assert session.find_snapshot(store) is None and store.list() == []
    monkeypatch.undo()
    assert session.save_snapshot(store) is not None, "the next save works"


def test_eviction_keeps_the_cap(tiny, tmp_path, caplog):
    model, tokenizer = tiny
    sessions = [prefilled_session(model, tokenizer, words_text(seed)) for seed in (1, 2, 3)]
    size = sessions[0].save_snapshot(SnapshotStore(tmp_path / "probe")).num_bytes
    store = SnapshotStore(tmp_path / "kv", max_bytes=int(2.5 * size))
    a = sessions[0].save_snapshot(store)
    sessions[1].save_snapshot(store)
    time.sleep(0.02)  # distinct last-used times
    assert open_session(model, tokenizer, words_text(1)).restore_snapshot(store) is not None  # a is now newer than b
    c = sessions[2].save_snapshot(store)
    assert {s.key for s in store.list()} == {a.key, c.key}, "the least recently used one is evicted"
    assert store.total_bytes() <= store.max_bytes

    tiny_store = SnapshotStore(tmp_path / "small", max_bytes=size // 2)
    with caplog.at_level(logging.WARNING):
        assert sessions[0].save_snapshot(tiny_store) is None
    assert "cap" in caplog.text and tiny_store.list() == []


def test_stale_temporaries_are_removed_on_open(tmp_path):
    root = tmp_path / "kv"
    stale, fresh = root / ".tmp-abc-1", root / ".tmp-def-2"
    for folder in (stale, fresh):
        folder.mkdir(parents=True)
        (folder / "layer-000.bin").write_bytes(b"partial")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    SnapshotStore(root)
    assert not stale.exists() and fresh.exists(), "a recent one may belong to a save in progress"


def test_delete_rejects_paths(store):
    with pytest.raises(ValueError, match="not a snapshot key"):
        store.delete("../models")


# -- the real SmolLM2 on a ~4K-token document (restoring beats reading by far more than 10x at any length) -------
_PLACES = ["Port Alder", "Wrenfield", "Castlemoor", "Eastbrook", "Lowmarsh", "Hollins Bay", "Greystone", "Fenwick"]
_PEOPLE = ["Miriam Okafor", "Tomas Lindqvist", "Aiko Tanaka", "Rafael Duarte", "Ingrid Holm", "Samuel Achebe",
           "Lucia Ferri", "Owen Pritchard", "Nadia Petrova", "Jonah Whitlock"]
_THINGS = ["a stone bridge", "a clock tower", "a public library", "a lighthouse", "a grain mill", "a music hall",
           "a glass factory", "a botanical garden", "a railway station", "a school of navigation"]
_SENTENCES = [
    "In {year}, the people of {place} built {thing} with money raised by {person}.",
    "{person} moved to {place} in {year} and worked for {n} years as a {job}.",
    "The winter of {year} was so cold in {place} that {thing} closed for {n} weeks.",
    "Records kept by {person} show that {place} had {big} inhabitants in {year}.",
    "Visitors to {place} often remark that {thing} is painted {color}, a choice made by {person}.",
    "A storm in {year} damaged {thing} in {place}; repairs cost {big} silver crowns.",
    "{person}, a {job} from {place}, wrote {n} letters about {thing} that survive today.",
    "Every spring since {year}, {place} holds a fair near {thing}, and {person} opened the first one.",
]
_JOBS = ["carpenter", "teacher", "harbour pilot", "clockmaker", "physician", "surveyor", "baker", "printer"]
_COLORS = ["deep green", "pale blue", "brick red", "ochre", "white", "charcoal grey"]
QUESTION = "Who was the lighthouse keeper of Port Alder, and what color was the keeper's door?"


def long_document(tokenizer, num_tokens: int) -> str:
    """Paragraphs of varied, fact-laden sentences (seeded), about ``num_tokens`` tokens long."""
    rng = random.Random(2024)
    paragraphs = ["The lighthouse keeper of Port Alder was Ingrid Holm, whose door was painted bright yellow."]
    total = len(tokenizer(paragraphs[0])["input_ids"])
    while total < num_tokens:
        sentences = [rng.choice(_SENTENCES).format(
            year=rng.randrange(1700, 1950), place=rng.choice(_PLACES), thing=rng.choice(_THINGS),
            person=rng.choice(_PEOPLE), job=rng.choice(_JOBS), color=rng.choice(_COLORS),
            n=rng.randrange(2, 40), big=f"{rng.randrange(1000, 90000):,}") for _ in range(rng.randrange(3, 7))]
        paragraph = " ".join(sentences)
        total += len(tokenizer("\n\n" + paragraph)["input_ids"])
        paragraphs.append(paragraph)
    return "\n\n".join(paragraphs)


def _answer_ids(session: DocumentSession) -> list[int]:
    """The greedy answer's token ids (with the question's), as fed back into the cache."""
    *_, last = session.ask(QUESTION, max_new_tokens=32)
    assert last.done and last.num_tokens > 0
    ids = session._cached_ids[session.document_tokens:]
    session.new_conversation()
    return ids


@pytest.fixture(scope="module")
def smollm2_book(tmp_path_factory):
    """SmolLM2 reads a ~4K-token document once: (model, tokenizer, text, prefill seconds, answer ids, store)."""
    from engine.models.loader import load_model

    model, tokenizer = load_model(None, device="cpu", weights="dense")
    text = long_document(tokenizer, 4000)
    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=1024), answer_budget=64)
    session.set_document(text)
    started = time.perf_counter()
    session.prefill()
    prefill_seconds = time.perf_counter() - started
    answer = _answer_ids(session)
    store = SnapshotStore(tmp_path_factory.mktemp("smollm2-kv"))
    assert session.save_snapshot(store) is not None  # after a question: only the document is saved
    return model, tokenizer, text, session.document_tokens, prefill_seconds, answer, store


@pytest.mark.slow
def test_smollm2_restore_gives_same_answer_faster_than_prefill(smollm2_book):
    model, tokenizer, text, num_tokens, prefill_seconds, answer, store = smollm2_book
    assert num_tokens >= 3800
    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=1024), answer_budget=64)
    session.set_document(text)
    started = time.perf_counter()
    stats = session.restore_snapshot(store)
    restore_seconds = time.perf_counter() - started
    assert stats is not None and session.is_prefilled
    assert _answer_ids(session) == answer, "greedy tokens identical after the restore"
    logging.getLogger(__name__).info("SmolLM2 %d tokens: prefill %.1f s, restore %.3f s (%.2f GB/s)",
                                     num_tokens, prefill_seconds, restore_seconds, stats.gb_per_second)
    assert restore_seconds * 10 <= prefill_seconds
