"""``DocumentSession.complete``: another client's prompt after the document (the OpenAI endpoint's path) answers from
the K/V the cache holds, with the very greedy tokens ``ask`` gives the same prompt, records no turn, and seeds its
sampling."""

from __future__ import annotations

import pytest

from engine import DocumentSession, OffloadPolicy

pytestmark = pytest.mark.slow

DOCUMENT = ("The lighthouse on Kerrow Point was built in 1871. Its keeper, Mara, trims the wick every evening. "
            "The secret launch code of the lighthouse is AMBER-7.\n") * 6
QUESTION = "What is the secret launch code?"


@pytest.fixture(scope="module")
def session(headinfer_smollm2):
    model, tokenizer = headinfer_smollm2
    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=64), answer_budget=128)
    session.set_document(DOCUMENT)
    session.prefill()
    return session


def test_complete_reuses_the_held_kv_and_gives_ask_s_greedy_tokens(session):
    continuation = session.prompts.conversation_ids(session.document, [], QUESTION)
    assert session.reused_tokens(continuation) == session.document_tokens  # the document, read once, is held
    *_, asked = session.ask(QUESTION, max_new_tokens=16, repetition_guard=None, sources=False)
    # After the answer the cache holds document + question + answer: all of the same prompt but its last token.
    assert session.reused_tokens(continuation) == session.document_tokens + len(continuation) - 1
    turns = session.conversation()
    *_, completed = session.complete(continuation, question=QUESTION, max_new_tokens=16, temperature=0.0,
                                     sources=False)
    assert completed.text == asked.text and completed.num_tokens == asked.num_tokens
    assert session.conversation() == turns  # no turn recorded: the page's conversation is its own


def test_complete_seeds_its_sampling(session):
    continuation = session.prompts.conversation_ids(session.document, [], "Describe the keeper.")

    def sampled(seed: int) -> str:
        *_, end = session.complete(continuation, max_new_tokens=12, temperature=1.2, seed=seed, sources=False)
        return end.text

    first = sampled(7)
    assert sampled(7) == first
    assert any(sampled(seed) != first for seed in (8, 9, 10))
