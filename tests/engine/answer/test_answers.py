"""Answers on the real SmolLM2: attention-grounded sources point at the page that holds the answer, the
repetition guard only acts when asked to, and progress arrives from inside long chunks."""

from __future__ import annotations

import pytest

from engine import DocumentSession, OffloadPolicy
from engine.types import page_markers

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_and_tokenizer(headinfer_smollm2):
    return headinfer_smollm2


@pytest.mark.parametrize("depth", [0.15, 0.85])
def test_top_source_is_the_page_that_holds_the_needle(model_and_tokenizer, depth):
    from benchmarks.quality.niah import paged_haystack

    model, tokenizer = model_and_tokenizer
    document, value, page = paged_haystack(tokenizer, 1200, depth, seed=int(depth * 100))
    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=512), answer_budget=64)
    session.set_document(document, pages=page_markers(document))  # the haystack's markers are its own
    progress = []
    session.prefill(on_progress=progress.append)
    *_, last = session.ask("What is the secret passphrase?", max_new_tokens=24)
    assert value in last.text.lower()
    assert last.sources and last.sources[0].page == page, (last.sources, page)
    assert last.sources[0].share > 0.5 and sum(s.share for s in last.sources) <= 1.0 + 1e-9
    assert progress[-1].tokens_done == session.document_tokens and progress[-1].eta_seconds == 0
    # Off, nothing is recorded and the final chunk says so.
    session.new_conversation()
    *_, plain = session.ask("What is the secret passphrase?", max_new_tokens=24, sources=False)
    assert plain.sources == () and plain.text == last.text and session.cache.schedule.probe is None


def test_repetition_guard_off_is_the_exact_greedy_continuation(model_and_tokenizer):
    from engine.answer.sampling import RepetitionGuard

    model, tokenizer = model_and_tokenizer
    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=512), answer_budget=96)
    session.set_document("Repeat after me: la la la la la la la la la la la la la la la la la la la la.")
    session.prefill()
    *_, exact = session.ask("Write the word la sixty times.", max_new_tokens=80, repetition_guard=None, sources=False)
    session.new_conversation()
    *_, guarded = session.ask("Write the word la sixty times.", max_new_tokens=80, sources=False,
                              repetition_guard=RepetitionGuard(penalty=1.0))
    # Without a penalty the guard changes nothing but the stop: the guarded answer is a prefix of the exact one.
    assert exact.text.startswith(guarded.text)
    if guarded.looped:
        assert guarded.num_tokens < exact.num_tokens
