"""The page marker has one writer and one parser (``engine.prompt``), shared by the app's viewer and the sources."""

from __future__ import annotations

import torch

from app.documents import Document
from app.pages import join, split_pages
from engine.answer.sources import page_starts_from_offsets, rank_sources
from engine.types import page_marker, page_markers

BOOK = "\n\n".join([f"{page_marker('i', 1)}\nPreface words.",
                    f"{page_marker('xii', 2)}\nA book that quotes [page 3] mid-line is still on page xii.",
                    f"{page_marker(None, 3)}\nAn unnumbered plate.",
                    f"{page_marker(37, 4)}\nThe body."])


def test_the_viewer_and_the_sources_see_the_same_pages():
    labels = [m.label for m in page_markers(BOOK)]
    assert labels == ["i", "xii", "PDF 3", "37"]  # "[page 3]" quoted mid-line is no page
    assert list(split_pages(join([Document("book.pdf", "pdf", BOOK, 4)]))) == labels
    starts = list(range(len(BOOK)))  # one token per character
    assert [label for _, label in page_starts_from_offsets(BOOK, starts)] == labels


def test_roman_and_unnumbered_pages_get_sources():
    starts = list(range(len(BOOK)))
    pages = page_starts_from_offsets(BOOK, starts)
    mass = torch.zeros(len(BOOK), dtype=torch.float64)
    quoted = BOOK.index("[page 3]")
    mass[quoted : quoted + 8] = 3.0  # the attention falls on the quote, inside page xii
    mass[BOOK.index("An unnumbered") :][:5] = 1.0
    ranked = rank_sources(mass, (0, len(BOOK)), pages)
    assert [(s.page, round(s.share, 2)) for s in ranked] == [("xii", 0.83), ("PDF 3", 0.17)]
