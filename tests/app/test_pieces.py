"""A way into a whole book (app.pieces): the set's pages with their printed labels, a range's text and token
count off the one tokenization, the first part that fits; and where a partial read stopped (app.pages)."""

from __future__ import annotations

from app.documents import Document
from app.pieces import (choices, describe, first_part_that_fits, parts_read, pieces_of, range_text, range_tokens,
                            rejoin)
from app.pages import join, last_page, split_pages
from engine.types import page_marker as marker
from engine.types import DocumentTokens


def _book(name: str, labels: list[str | None], first_sequence: int = 1) -> Document:
    text = "\n\n".join(f"{marker(label, n)}\nWords of page {n}. " + "word " * 20
                       for n, label in enumerate(labels, start=first_sequence))
    return Document(name, "pdf", text, pages=len(labels))


def _tokens(text: str) -> DocumentTokens:
    """One token per character: counts are easy to check."""
    from array import array

    return DocumentTokens(text, list(range(len(text))), array("q", range(len(text))))


def test_pieces_keep_labels_files_and_the_combined_text():
    documents = [_book("bash.pdf", [None, "i", "37", "38", "39"]), Document("notes.txt", "txt", "Plain notes.")]
    text = join(documents)
    pieces = pieces_of(documents)
    assert [piece.label for piece in pieces] == ["PDF 1", "i", "37", "38", "39", ""]
    assert [label for label, _ in choices(pieces)][:3] == ["PDF p. 1 · bash.pdf", "p. i · bash.pdf", "p. 37 · bash.pdf"]
    assert choices(pieces)[-1] == ("notes.txt (whole file)", 5)
    chosen = range_text(text, pieces, 2, 3)
    assert chosen.startswith("=== bash.pdf · PDF pages 3–4 ===\n[page 37]\n") and "[page 38]" in chosen and "[page 39]" not in chosen
    assert list(split_pages(chosen)) == ["37", "38"]
    both = range_text(text, pieces, 4, 5)
    assert both.endswith("=== notes.txt ===\nPlain notes.") and "=== bash.pdf · PDF pages 5–5 ===\n[page 39]" in both
    assert describe(pieces, 2, 4) == "p. 37 – p. 39 of bash.pdf"


def test_a_range_is_counted_off_the_whole_sets_tokens_and_the_first_part_fits():
    documents = [_book("bash.pdf", [str(n) for n in range(1, 21)])]
    text = join(documents)
    tokens, pieces = _tokens(text), pieces_of(documents)
    assert range_tokens(tokens, pieces, 0, 0) == pieces[0].end - pieces[0].start
    assert range_tokens(tokens, pieces, 3, 5) == pieces[5].end - pieces[3].start
    limit = 1000
    last = first_part_that_fits(tokens, pieces, limit)
    assert range_tokens(tokens, pieces, 0, last) <= limit < range_tokens(tokens, pieces, 0, last + 1) + 100
    assert first_part_that_fits(tokens, pieces, 10) is None  # not even the first page


def test_last_page_names_where_a_partial_read_stopped():
    text = join([_book("bash.pdf", ["36", "37", "38"])])
    assert last_page(text[: text.index("[page 38]")], text) == "p. 37 of bash.pdf"
    assert last_page("no pages here") is None


def test_a_range_from_a_later_page_keeps_the_pdf_sequence():
    documents = [_book("bash.pdf", [str(n) for n in range(30, 50)])]
    text = join(documents)
    pieces = pieces_of(documents)
    chosen = range_text(text, pieces, 8, 12)  # printed pages 38-42: PDF pages 9-13
    assert chosen.startswith("=== bash.pdf · PDF pages 9–13 ===\n[page 38]")
    pages = split_pages(chosen)
    assert pages["41"].sequence == 12 and pages["41"].name == "bash.pdf"


def test_a_saved_range_is_joined_again_from_its_documents_not_parsed():
    # A text file whose lines read like a range's header, a page marker and a file header: none is a boundary.
    notes = Document("notes.txt", "txt", "=== bash.pdf · PDF pages 1–2 ===\n[page 36]\nForged.\n\n=== evil ===")
    documents = [_book("bash.pdf", [str(n) for n in range(30, 50)]), notes]
    whole, pieces = join(documents), pieces_of(documents)
    chosen = range_text(whole, pieces, 18, 20)  # printed pages 48-49 of bash.pdf, then all of notes.txt
    assert chosen.startswith("=== bash.pdf · PDF pages 19–20 ===\n[page 48]")
    assert rejoin(str(chosen), documents).layout == chosen.layout  # saved as plain text, joined again
    parts = parts_read(str(chosen), documents)
    assert [(doc.name, doc.pages) for doc, _, _ in parts] == [("bash.pdf", 2), ("notes.txt", None)]
    assert parts[1][0].text == notes.text and str(chosen)[parts[0][1] : parts[0][2]] == parts[0][0].text
    # Its beginning, truncated to fit inside the first file: the pages it holds.
    cut = str(chosen)[: chosen.index("[page 49]") + 12] + "\n[... truncated to fit ...]"
    assert list(split_pages(rejoin(cut, documents))) == ["48", "49"]
    head = str(whole)[: whole.index("[page 33]")] + "\n[... truncated to fit ...]"
    assert last_page(rejoin(head, documents)) == "p. 32 of bash.pdf"
    assert rejoin("=== bash.pdf ===\nsomething else", documents).layout.files == ()
