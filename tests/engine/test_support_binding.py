"""binding_share: an answer copied from a neighbouring entity's string sits in a sentence (and a section) about
that other entity. The pages are the R Installation and Administration manual's (R 4.2.2, pp. 17 and 20, as the
app's PDF reader extracts them), the answers the CPU default model's own (docs/benchmarks/data/support-held-out.jsonl)."""

from __future__ import annotations

import pytest

from engine.answer.support_binding import _sections, binding_share
from engine.answer.support_entity import entity_share

WINDOWS = """3 Installing R under Windows
The bin/windows directory of a
CRAN site contains binaries for a base distribution and a large number of add-on packages
from CRAN to run on 64-bit Windows.
3.1 Building from source
It is possible to use other 64-bit toolchains (including ‘MSYS2’) with UCRT support to
build R, but this manual only documents that used for binary distributions of R 4.2.x.
3.1.1 The Windows toolset
The binary distribution of R is currently built with tools from Rtools42 for Windows
(https://cran.r-project.org/bin/windows/Rtools/rtools42/rtools.html).
The toolset includes compilers (GCC version 10.3.0 with selected additional patches) and
runtime libraries from the ‘MinGW-w64’ project (http://mingw-w64.org/).
3.1.2 LATEX
Both building R and checking packages need a distribution of LATEX installed, with the
directory containing pdflatex on the path.
The ‘MiKTeX’ (https://miktex.org/) distribution of LATEX is that used on CRAN. This
can be set up to install extra packages ‘on the fly’ (without asking).
"""
MACOS = """4 Installing R under macOS
The front page of a CRAN site has
a link ‘Download R for (Mac) OS X’ which takes you to a new page. The first runs on macOS 10.13 and
later on ‘x86_64’ (Intel) CPU. For building R from source on macOS, see Section C.3 [macOS], page 66.
2 These include the tcltk package and the X11 graphics device: attempting
to use these without XQuartz installed will fail.
"""
DOCUMENT = "[page 17]\n" + WINDOWS + "\n[page 20]\n" + MACOS


def _pages() -> list[tuple[int, int]]:
    first = DOCUMENT.index(WINDOWS)
    second = DOCUMENT.index(MACOS)
    return [(first, first + len(WINDOWS)), (second, second + len(MACOS))]


def test_a_copied_neighbours_version_scores_under_the_right_answer():
    """"GCC 10.3.0" for macOS: the model's answer copies the Windows toolset's version. Its sentence and headings
    say nothing of macOS; the right answer's heading names the Windows toolset it was asked about."""
    right = binding_share("Which GCC version does the Windows toolset of R include?",
                          "The Windows toolset of R includes compilers (GCC version 10.3.0 with selected additional "
                          "patches).", DOCUMENT, _pages())
    copied = binding_share("Which GCC version is needed to build R from source on macOS?",
                           "The GCC version needed to build R from source on macOS is 10.3.0 with selected "
                           "additional patches.", DOCUMENT, _pages())
    assert right == pytest.approx(1.0)
    assert copied < right
    # What it misses is the platform: the same answer asked for Windows is bound in full.
    assert binding_share("Which GCC version is needed to build R from source on Windows?", "The GCC version needed "
                         "to build R from source on Windows is 10.3.0 with selected additional patches.", DOCUMENT,
                         _pages()) == pytest.approx(1.0)


def test_the_headings_name_the_entity_a_sentence_leaves_out():
    """"MiKTeX ... is that used on CRAN" names no platform; the chapter it is under does (3 Installing R under
    Windows). Asked for macOS, the same sentence answers under the wrong chapter."""
    windows = ("Which LaTeX distribution is used on CRAN for Windows?", "The 'MiKTeX' distribution of LATEX is that "
               "used on CRAN.")
    macos = ("Which LaTeX distribution is used on CRAN for macOS?", "The LaTeX distribution used on CRAN for macOS is "
             "the 'MiKTeX' (https://miktex.org/) distribution.")
    with_headings = [binding_share(q, a, DOCUMENT, _pages()) for q, a in (windows, macos)]
    sentence_alone = [binding_share(q, a, DOCUMENT, _pages(), headings=False) for q, a in (windows, macos)]
    assert with_headings[0] == pytest.approx(1.0) and with_headings[1] < 0.8
    assert sentence_alone[0] == pytest.approx(sentence_alone[1])  # the sentence alone cannot tell them apart


def test_a_neighbouring_sentence_does_not_bind_where_a_window_would():
    """"macOS" in the next sentence is within entity_share's window of "10.13", but the sentence holding the
    copied string is about another file."""
    page = ("The first file runs on Windows 10 and later. The second file runs on macOS 10.13 and later.\n"
            "Filler about CRAN mirrors.\n")
    document = "[page 1]\n" + page
    pages = [(document.index(page), len(document))]
    question, answer = "Which Windows version does the second file need?", "The second file needs Windows 10."
    assert binding_share(question, answer, document, pages, headings=False) < 0.7
    assert entity_share(question, answer, [page], document) == pytest.approx(1.0)


def test_sections_climb_the_numbered_headings_and_skip_footnotes():
    at = DOCUMENT.index("MiKTeX")
    sections = _sections(DOCUMENT, at).splitlines()
    assert sections == ["3.1.2 LATEX", "3.1 Building from source", "3 Installing R under Windows"]
    # A footnote line ("2 These include ...:") is no chapter: the text after it is still under chapter 4.
    assert _sections(DOCUMENT, DOCUMENT.index("XQuartz")).splitlines() == ["4 Installing R under macOS"]
    assert _sections("No headings here.", 3) == ""


def test_an_answer_on_no_cited_page_is_zero_and_no_own_word_is_none():
    question = "Which GCC version does the Windows toolset of R include?"
    assert binding_share(question, "GCC 99.9.9.", DOCUMENT, _pages()) == 0.0  # an invented version, on no page
    assert binding_share(question, "GCC version.", DOCUMENT, _pages()) is None  # restates the question only
    assert binding_share(question, "GCC 10.3.0.", DOCUMENT, []) is None  # no cited page
