"""The reverse question (which entity the document gives the answer for) and the own-token counterfactual gain:
the cloze built by the module's rule, the candidates' teacher-forced log-probs equal to a stock forward's (the
cache left as it was), the margin, and the gain read off the answer's own tokens only."""

from __future__ import annotations

import pytest
from support_pages import DOCUMENT, PAGE_1, PAGE_2, asked_and_cleared, stock_logprobs

from engine.answer.support_own_gain import own_token_gain
from engine.answer.support_reverse import BLANK, reverse_cloze, reverse_margin
from engine.answer.teacher_forced import candidate_logprobs
from engine.errors import InputError


def test_a_copied_neighbours_answer_is_asked_which_entity_it_is_given_for():
    # "4.1.3" sits in a sentence about Windows: macOS, asked and not said there, is blanked; the rivals are the
    # page's other names, the nearest first (Windows, in the anchor's own sentence).
    cloze = reverse_cloze("Which was the last version of R to support 32-bit macOS?",
                          "The last version to support 32-bit macOS was R 4.1.3.", DOCUMENT, [PAGE_1])
    assert cloze.word == "macOS"
    assert cloze.rivals[0] == "Windows" and "macOS" not in cloze.rivals
    assert cloze.question == f"Which was the last version of R to support 32-bit {BLANK}?"
    assert cloze.answer == f"The last version to support 32-bit {BLANK} was R 4.1.3."
    assert "macOS" not in cloze.prompt and BLANK in cloze.prompt


def test_the_rivals_are_of_the_blanked_words_kind_and_at_most_three():
    # A version blanked competes with versions only.
    cloze = reverse_cloze("Which GCC does Rtools 4.1.3 use?", "GCC 10.3.0", DOCUMENT + "R 3.6 and 2.15 and 1.9.\n",
                          [(PAGE_1[0], len(DOCUMENT) + 25)], rivals=1)
    assert cloze is not None and len(cloze.rivals) == 1
    assert all(any(c.isdigit() for c in rival) for rival in cloze.rivals) == any(c.isdigit() for c in cloze.word)


def test_without_an_entity_or_an_anchor_or_a_rival_there_is_no_reverse_question():
    assert reverse_cloze("which compiler is provided?", "clang", DOCUMENT, [PAGE_2]) is None
    assert reverse_cloze("Which version does Xcode provide?", "clang", DOCUMENT, []) is None
    assert reverse_cloze("Which version does Xcode provide?", "nothing here", DOCUMENT, [PAGE_2]) is None


def test_the_margin_is_the_word_asked_against_the_best_rival():
    assert reverse_margin([-0.5, -0.5], [[-3.0], [-0.25, -0.25], [-9.0]]) == pytest.approx(-1.0 + 0.5)


def test_the_own_token_gain_leaves_out_the_echoed_question():
    tokens = ["For", " macOS", " it", " is", " 4.1.3"]
    asked = [-0.1, -0.2, -0.3, -0.4, -0.5]
    swapped = [-0.1, -5.0, -0.3, -0.4, -0.5]  # only the echoed "macOS" became unlikely
    assert own_token_gain(tokens, asked, swapped, "Which version for macOS?") == pytest.approx(0.0)
    assert own_token_gain(tokens, asked, [-0.1, -0.2, -0.3, -0.4, -2.5], "Which version for macOS?") == \
        pytest.approx(2.0)
    assert own_token_gain(["macOS"], [-0.1], [-0.2], "Which version for macOS?") is None
    assert own_token_gain(tokens, asked, swapped[:-1], "Which version for macOS?") is None


def test_candidate_log_probs_equal_a_stock_forward_and_leave_the_cache(tiny_dir):
    folder, model, tokenizer = tiny_dir
    session, before, length, context = asked_and_cleared(model, tokenizer)
    candidates = [tokenizer.encode(text, add_special_tokens=False) for text in ("w12", "w13 w14 w15", "w2 w1")]
    scored = candidate_logprobs(session.model, session.cache, context, candidates)

    for candidate, got in zip(candidates, scored):
        expected = stock_logprobs(folder, session._document_ids + context + candidate, candidate)
        assert got == pytest.approx(expected, abs=1e-4)
    assert session.cache.get_seq_length() == length
    *_, last = session.ask("w3 w4 w5", max_new_tokens=6)
    assert last.text == before
    with pytest.raises(InputError):
        candidate_logprobs(session.model, session.cache, context, [[]])
