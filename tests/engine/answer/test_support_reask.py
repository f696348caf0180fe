"""The rival's question re-asked: the overlap's rule (a copy's re-answer repeats its string, a right answer's says
another; no key word, no signal) and the re-ask leaving the session's conversation and cache as they were."""

from __future__ import annotations

import pytest
from support_pages import DOCUMENT

from benchmarks.quality.support_counterfactual import reanswer
from engine.answer.support_reask import key_weights, reask_overlap

ASKED = "Which was the last version of R to support 32-bit macOS?"
SWAPPED = "Which was the last version of R to support 32-bit Windows?"
COPY = "The last version of R to support 32-bit macOS was R 4.1.3."


def test_a_copy_says_its_string_again_for_the_rival():
    # The key word is the version alone (the rest is in the questions): said again, the overlap is whole.
    assert set(key_weights(COPY, ASKED, SWAPPED, DOCUMENT)) == {"4.1.3"}
    again = "The last version of R to support 32-bit Windows was R 4.1.3."
    assert reask_overlap(COPY, again, ASKED, SWAPPED, DOCUMENT) == pytest.approx(1.0)


def test_a_right_answer_says_something_else_for_the_rival():
    right = "macOS 10.13 or later; Xcode provides clang."
    question = "What does the macOS build need?"
    rival = "What does the Windows build need?"
    assert reask_overlap(right, "Rtools with GCC 10.3.0.", question, rival, DOCUMENT) == pytest.approx(0.0)
    # One of its key words said again (the version), the others not: a part of the weight.
    partly = reask_overlap(right, "It needs Windows 10.13.", question, rival, DOCUMENT)
    assert 0.0 < partly < 1.0


def test_without_a_key_word_there_is_no_signal():
    assert reask_overlap("32-bit macOS.", "32-bit Windows.", ASKED, SWAPPED, DOCUMENT) is None
    # A word on every line of the document weighs nothing: "R" alone is no key word there.
    assert reask_overlap("R.", "R.", "Which version?", "Which one?", "R a\nR b\n") is None


def test_the_reask_leaves_the_conversation_and_cache_as_they_were(tiny):
    from tiny_sessions import prefilled_session, words_text

    model, tokenizer = tiny
    text = words_text(7, 120)
    control = prefilled_session(model, tokenizer, text)
    *_, first = control.ask("w3 w4 w5", max_new_tokens=6)
    *_, expected = control.ask("w9 w10 w11", max_new_tokens=6)

    session = prefilled_session(model, tokenizer, text)
    *_, _ = session.ask("w3 w4 w5", max_new_tokens=6)
    conversation, dropped = session.conversation(), session.dropped_turns
    final = reanswer(session, "w12 w13 w14", max_new_tokens=6)
    assert final.done and final.num_tokens > 0
    assert session.conversation() == conversation == [("w3 w4 w5", first.text)]
    assert session.dropped_turns == dropped
    assert session.cache.get_seq_length() == session.prefilled_tokens  # the re-ask's tokens are gone
    *_, after = session.ask("w9 w10 w11", max_new_tokens=6)
    assert after.text == expected.text
