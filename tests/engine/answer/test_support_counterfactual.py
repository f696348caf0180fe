"""The counterfactual support signal: the question with its entity swapped for the answer's neighbour, and the
teacher-forced log-probs it is scored with (equal to a stock forward; the cache left as it was)."""

from __future__ import annotations

import pytest
from support_pages import DOCUMENT, PAGE_1, PAGE_2, asked_and_cleared, stock_logprobs

from engine.answer.support_counterfactual import counterfactual_gain, counterfactual_question
from engine.answer.teacher_forced import continuation_logprobs
from engine.errors import InputError


def test_a_copied_neighbours_answer_gets_the_neighbours_question():
    # "4.1.3" sits in a sentence about Windows: macOS, asked and not said there, becomes Windows.
    asked = "Which was the last version of R to support 32-bit macOS?"
    assert counterfactual_question(asked, "R 4.1.3", DOCUMENT, [PAGE_1]) == \
        "Which was the last version of R to support 32-bit Windows?"


def test_a_bound_answer_has_its_rarest_entity_swapped_for_one_of_the_same_kind():
    # Everything asked is said about "10.13": the rarest name asked (macOS) goes, for the page's nearest other name.
    swapped = counterfactual_question("Which version does the macOS build need?", "macOS 10.13 or later", DOCUMENT,
                                      [PAGE_2])
    assert swapped == "Which version does the Xcode build need?"


def test_without_a_rival_the_entity_is_dropped_and_without_entities_there_is_no_question():
    assert counterfactual_question("Which version does Xcode provide?", "clang", DOCUMENT, []) == \
        "Which version does provide?"
    assert counterfactual_question("which compiler is provided?", "clang", DOCUMENT, [PAGE_2]) is None


def test_the_gain_is_the_difference_of_mean_log_probs():
    assert counterfactual_gain([-0.1, -0.3], [-1.0, -2.0, -3.0]) == pytest.approx(-0.2 + 2.0)


def test_teacher_forced_log_probs_equal_a_stock_forward_and_leave_the_cache(tiny_dir):
    folder, model, tokenizer = tiny_dir
    session, before, length, context = asked_and_cleared(model, tokenizer)
    target = tokenizer.encode("w12 w13 w14 w15", add_special_tokens=False)
    scored = continuation_logprobs(session.model, session.cache, context, target)

    expected = stock_logprobs(folder, session._document_ids + context + target, target)
    assert scored == pytest.approx(expected, abs=1e-4)
    assert session.cache.get_seq_length() == length
    *_, last = session.ask("w3 w4 w5", max_new_tokens=6)
    assert last.text == before
    with pytest.raises(InputError):
        continuation_logprobs(session.model, session.cache, [], target)
