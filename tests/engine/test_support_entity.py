"""entity_share: an answer copied from a neighbouring entity's string is said among another entity's words."""

from __future__ import annotations

import pytest

from engine.answer.support_entity import entity_share, line_weights

# A manual's page: two platforms, each with its own version and maintainer, a few lines apart (as in the R FAQ).
PAGE = """2.5.2 How can R be installed (Windows)
The bin/windows directory of a CRAN site contains binaries for 64-bit versions of Windows 7 and later.
R 4.1.3 was the last version of R to support 32-bit Windows.
The Windows version of R was created by Robert Gentleman and Guido Masarotto.
See the R for Windows FAQ for more details on the installer.
Some filler about CRAN mirrors and the R home page, to keep the platforms apart.
More filler: CRAN sites mirror the sources, the binaries and the documentation of R.
Yet more filler on the mailing lists of R and the posting guide to read before posting.
2.5.3 How can R be installed (Mac)
The bin/macosx directory of a CRAN site contains an installer package to run on macOS 10.13 or later.
This port of R for macOS is maintained by Simon Urbanek.
See the R for macOS FAQ for more details on the installer.
"""
OTHER_PAGE = "Chapter 3 R and S\nS is a language developed at Bell Labs.\nR is an implementation of S.\n"
DOCUMENT = "[page 5]\n" + PAGE + "\n[page 9]\n" + OTHER_PAGE


def test_a_right_answer_is_said_among_the_questions_words():
    share = entity_share("Which was the last version of R to support 32-bit Windows?",
                         "R 4.1.3 was the last version to support 32-bit Windows.", [PAGE], DOCUMENT)
    assert share == pytest.approx(1.0)


def test_a_neighbours_string_is_said_among_another_entitys_words():
    """The same copied string answering the question about macOS: one of the question's words the page uses,
    "macOS", is not within reach of "4.1.3". It is said elsewhere on the page, so the words the document uses
    (``asked_share``) cannot tell, and "4.1.3" is on the cited page (``grounded_share`` cannot either)."""
    right = entity_share("Which was the last version of R to support 32-bit Windows?", "R 4.1.3.", [PAGE], DOCUMENT)
    copied = entity_share("Which was the last version of R to support 32-bit macOS?", "R 4.1.3.", [PAGE], DOCUMENT)
    assert copied < right - 0.1
    # Another entity's maintainer: "Urbanek" sits among macOS' words, the question asks about Windows.
    maintainer = entity_share("Who maintains the port of R for Windows?", "Simon Urbanek maintains it.", [PAGE],
                              DOCUMENT)
    assert maintainer < entity_share("Who maintains the port of R for macOS?", "Simon Urbanek maintains it.",
                                     [PAGE], DOCUMENT) - 0.1


def test_only_the_cited_pages_count_and_an_answer_on_none_of_them_is_zero():
    question = "Which was the last version of R to support 32-bit Windows?"
    assert entity_share(question, "R 4.1.3.", [OTHER_PAGE], DOCUMENT) == 0.0  # cited a page without "4.1.3"
    assert entity_share(question, "R 9.9.9.", [PAGE], DOCUMENT) == 0.0  # an invented version, on no page
    assert entity_share(question, "R 4.1.3.", [], DOCUMENT) is None  # no sources: no signal
    # An answer that only restates the question claims nothing of its own.
    assert entity_share(question, "The last version of R to support 32-bit Windows.", [PAGE], DOCUMENT) is None


def test_words_on_every_line_weigh_nothing_and_rare_ones_most():
    """The claim's own words are weighted by rarity: a rare one ("Callaway") says where the claim was read."""
    weights = line_weights("R alpha\nR beta\nR gamma macos\nR delta macos\n")
    assert weights["r"] == 0.0
    assert weights["alpha"] > weights["maco"] > 0.0  # stems: "macos" -> "maco"


def test_decide_flags_an_answer_said_among_another_entitys_words_only_when_the_threshold_is_on():
    from engine.answer.support import SupportThresholds, decide
    from engine.errors import InputError

    copied = entity_share("Which was the last version of R to support 32-bit macOS?", "R 4.1.3.", [PAGE], DOCUMENT)
    on = SupportThresholds(min_document_share=0.0, min_mean_logprob=-100.0, min_entity_share=0.9)
    assert not decide(0.8, -0.1, on, entity=copied).is_supported
    assert decide(0.8, -0.1, on, entity=1.0).is_supported
    assert decide(0.8, -0.1, on, entity=None).is_supported  # no sources: the signal is missing and does not flag
    assert decide(0.8, -0.1, SupportThresholds(), entity=copied).is_supported  # off by default
    assert decide(0.8, -0.1, on, entity=copied).entity_share == copied
    with pytest.raises(InputError):
        SupportThresholds(min_entity_share=1.5)


def test_the_attention_peaks_context_tells_a_neighbours_string_from_the_asked_entitys():
    """The answer's attention read instead of its words: peaks on Windows' line answer a Windows question and not a
    macOS one; peaks spread by their shares."""
    from engine.answer.support_entity import peak_entity_share

    windows = DOCUMENT.index("R 4.1.3")
    mac = DOCUMENT.index("maintained by Simon Urbanek")
    question = "Which was the last version of R to support 32-bit macOS?"
    on_windows = peak_entity_share(question, DOCUMENT, [(windows, 0.5)])
    assert on_windows < peak_entity_share(question.replace("macOS", "Windows"), DOCUMENT, [(windows, 0.5)])
    maintainer = "Who maintains the port of R for macOS?"
    assert peak_entity_share(maintainer, DOCUMENT, [(mac, 0.4)]) == pytest.approx(1.0)
    mixed = peak_entity_share(maintainer, DOCUMENT, [(mac, 0.3), (DOCUMENT.index("Chapter 3"), 0.1)])
    assert mixed == pytest.approx(0.75 + 0.25 * peak_entity_share(maintainer, DOCUMENT,
                                                                  [(DOCUMENT.index("Chapter 3"), 1.0)]))
    assert peak_entity_share(maintainer, DOCUMENT, []) is None
