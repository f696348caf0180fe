"""A whole document session on emulated streams with the checker on: a cancelled read resumed, answers,
sources read from the attention, a snapshot saved and restored into another session — all equal to the
synchronous path's (a CPU-only machine's), and no race."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
import torch
from tiny_sessions import tiny_model, word_tokenizer, words_text

from engine import DocumentSession, OffloadPolicy, PrefillCancelled, SnapshotStore
from engine.answer.sources import attention_mass
from engine.errors import RaceError
from engine.kv.probe import QueryProbe
from engine.store import streaming

POLICY = dict(chunk_size=40, resident_slots=0, head_group_size=1, host_attention="all")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("tiny")), word_tokenizer()


def _session(model, tokenizer, streams: str, **policy) -> DocumentSession:
    session = DocumentSession(model, tokenizer, OffloadPolicy(**{**POLICY, **policy}, streams=streams),
                              answer_budget=32)
    session.set_document(words_text(4, words=150))
    return session


def _cancelled_then_resumed(session: DocumentSession) -> None:
    def stop_in_the_second_chunk() -> bool:
        # Between layers: the first layer already holds the second chunk, the others not yet.
        lengths = [layer.length for layer in session.cache.kv_layers]
        return lengths[0] > POLICY["chunk_size"] and lengths[-1] <= POLICY["chunk_size"]

    with pytest.raises(PrefillCancelled):
        session.prefill(should_stop=stop_in_the_second_chunk)
    assert 0 < session.prefilled_tokens < session.document_tokens
    session.prefill()  # resumes where it stopped


def _answers(session: DocumentSession) -> list[str]:
    texts = []
    for question in ("w3 w4 w5", "w9 w10"):  # the second is a follow-up: the conversation stays in the KV
        *_, last = session.ask(question, max_new_tokens=8, sources=False, repetition_guard=None)
        texts.append(last.text)
    return texts


def _mass(session: DocumentSession) -> torch.Tensor:
    cache = session.cache
    probe = QueryProbe({0: [0, 1, 2], 2: [3]}, min_position=session.document_tokens)
    cache.record_queries(probe)
    try:
        *_, last = session.ask("w7 w8", max_new_tokens=4, sources=False, repetition_guard=None)
    finally:
        cache.record_queries(None)
    return attention_mass(cache, probe)


def _races(session: DocumentSession) -> list[str]:
    return list(session.cache.transfer.streams.checker.races)


@torch.inference_mode()
def test_a_session_on_emulated_streams_equals_the_synchronous_one(tiny, tmp_path, monkeypatch):
    model, tokenizer = tiny
    monkeypatch.setenv("HEADINFER_STREAMS_SEED", "3")
    expected = _session(model, tokenizer, "sync")
    expected.prefill()
    expected_answers, expected_mass = _answers(expected), _mass(expected)

    emulated = _session(model, tokenizer, "emulated")
    _cancelled_then_resumed(emulated)
    assert _answers(emulated) == expected_answers
    assert torch.allclose(_mass(emulated), expected_mass, rtol=1e-6, atol=1e-9)
    assert _races(emulated) == []

    store = SnapshotStore(tmp_path / "kv")
    emulated.new_conversation()
    assert emulated.save_snapshot(store) is not None
    restored = _session(model, tokenizer, "emulated", head_group_size=2)
    assert restored.restore_snapshot(store) is not None
    assert _answers(restored) == expected_answers
    assert _races(restored) == [] and _races(emulated) == []


def _resident_session(model, tokenizer, streams: str) -> DocumentSession:
    session = _session(model, tokenizer, streams, resident_slots=3, host_attention="off")
    session.prefill()
    return session


@torch.inference_mode()
def test_snapshots_of_resident_homes_go_through_the_seam(tiny, tmp_path, monkeypatch):
    """Resident (device) homes save and restore through the staging buffers as on a GPU, every copy and wait
    through the streams seam, so the checker sees them: exact, and no race."""
    model, tokenizer = tiny
    monkeypatch.setenv("HEADINFER_STREAMS_SEED", "5")
    monkeypatch.setattr(streaming, "PIECE_BYTES", 512)  # many pieces per run: the two buffers are reused
    expected = _answers(_resident_session(model, tokenizer, "sync"))
    staged = []
    acquire = streaming._Staging.acquire
    monkeypatch.setattr(streaming._Staging, "acquire", lambda self: staged.append(1) or acquire(self))
    saver = _resident_session(model, tokenizer, "emulated")
    store = SnapshotStore(tmp_path / "kv")
    assert saver.save_snapshot(store) is not None
    restored = _session(model, tokenizer, "emulated", resident_slots=3, host_attention="off")
    assert restored.restore_snapshot(store) is not None
    assert len(staged) > 4  # the resident homes' runs went through the staging buffers, both ways
    assert _answers(restored) == expected
    assert _races(saver) == [] and _races(restored) == []


@pytest.mark.parametrize("wait", ["the saved piece's landing", "the staging buffer's reuse"])
@torch.inference_mode()
def test_the_checker_sees_a_missing_snapshot_wait(tiny, tmp_path, monkeypatch, wait):
    """Each wait of the staged path matters: without it the host reads bytes still being copied (save) or
    overwrites a buffer the compute stream is still copying from (restore), and the checker says so."""
    model, tokenizer = tiny
    monkeypatch.setattr(streaming, "PIECE_BYTES", 512)
    session = _resident_session(model, tokenizer, "emulated")
    store = SnapshotStore(tmp_path / "kv")
    if wait == "the staging buffer's reuse":
        session.save_snapshot(store)  # saved with every wait
        session = _session(model, tokenizer, "emulated", resident_slots=3, host_attention="off")
        monkeypatch.setattr(streaming, "_wait", lambda pending: [p.result() for p in pending if isinstance(p, Future)])
    else:
        event_type = type(session.cache.transfer.streams.event(blocking=True))
        monkeypatch.setattr(event_type, "synchronize", lambda self: None)  # the landing is not waited for
    with pytest.raises(RaceError):
        session.restore_snapshot(store) if wait == "the staging buffer's reuse" else session.save_snapshot(store)
