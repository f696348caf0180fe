"""PDF page cleanup (app.documents.pdf_layout): running headers/footers and line-end hyphenation,
on plain strings and on PDFs written with fpdf2 (real books: test_documents_real.py)."""

from __future__ import annotations

import pytest
from make_files import make_encrypted_pdf, make_labelled_pdf, make_pdf

from app.documents import DocumentError, read_document
from app.documents.pdf_layout import dehyphenate, printed_numbers, running_lines

FACT = "The lighthouse keeper's cat was named Bartholomew Quince."
WORDS = "river harbour lighthouse beacon tide reef gull cliff storm lantern wick oil".split()


def test_pdf_running_header_and_footer_removed(tmp_path):
    bodies = [f"Body of page {n}: the {word} stays." for n, word in enumerate(
        ["river", "harbour", "lighthouse", "beacon", "tide", "reef"], start=1)]
    path = make_pdf(tmp_path / "book.pdf", bodies, header="Sea Stories {page} / {pages}",
                    footer="- {page} -")
    doc = read_document(path)
    assert "Sea Stories" not in doc.text
    assert not any(line.startswith("- ") for line in doc.text.splitlines())
    for number, body in enumerate(bodies, start=1):
        assert f"[page {number}]\n{body}" in doc.text


def test_pdf_header_needs_repeats_a_short_document_keeps_everything(tmp_path):
    path = make_pdf(tmp_path / "memo.pdf", ["First.", "Second."], header="Memo {page}")
    assert read_document(path).text.count("Memo") == 2  # two pages cannot show a header repeats


def test_running_lines_alternating_footers_and_numbered_section_titles():
    pages = []
    for number in range(1, 13):
        printed = number + 4  # front matter: page 1 of the PDF is printed as page 5
        footer = f"{printed} Chapter 2. Files" if number % 2 else f"2.{number}. Some section {printed}"
        words = WORDS[number:] + WORDS[:number]
        pages.append(["Policy Manual, Release 4.6", " ".join(words[:4]), "Tip", " ".join(words[4:]), footer])
    running = running_lines(pages)
    assert running == [{0, 4}] * 12  # "Tip" repeats at no edge; body lines stay


def test_running_lines_keep_a_chapter_number_that_equals_the_page_number():
    pages = [[f"Book {n} / 9", "Chapter 1" if n == 1 else WORDS[n], WORDS[-n]] for n in range(1, 10)]
    assert running_lines(pages)[0] == {0}


@pytest.mark.parametrize(("broken", "expected"), [
    ("an exam-\nple of it", "an example of it"),
    ("an exam\ufffeple of it", "an example of it"),  # PDFium's marker for a line-end hyphen
    ("a well-\nknown fact", "a well-known fact"),  # compound head
    ("a self-\ncontained unit", "a self-contained unit"),
    ("Anti-\nAmerican", "Anti-American"),  # capital after the break
    ("the fonts-crosextra-\ncarlito package", "the fonts-crosextra-carlito package"),  # a name
    ("see debian-\npolicy.html", "see debian-policy.html"),
    ("done respec-\ntively.", "done respectively."),
    ("a 32-\nbit build", "a 32-\nbit build"),  # not letters on both sides: left as printed
    ("a well\u00ad\nknown soft hyphen", "a wellknown soft hyphen"),  # U+00AD is never in the word
    ("in\u00advisible", "invisible"),
])  # fmt: skip
def test_dehyphenate(broken, expected):
    assert dehyphenate(broken) == expected


def test_dehyphenate_follows_the_books_own_spelling():
    book = "The sea-\nfront is long. We walked the sea-front twice. A note-\nbook and a notebook."
    assert dehyphenate(book) == "The sea-front is long. We walked the sea-front twice. A notebook and a notebook."
    # Both parts are words of the book, the joined word is not: a compound broken at its hyphen.
    assert dehyphenate("time spent is time-\nconsuming; consuming time") == (
        "time spent is time-consuming; consuming time")


def test_pdf_hyphenation_joined_across_lines(tmp_path):
    text = "This is an exam-\nple of a well-\nknown break, and a second exam-\nple."
    doc = read_document(make_pdf(tmp_path / "h.pdf", [text]))
    assert "an example of a well-known break, and a second example." in " ".join(doc.text.split())


def test_pypdf_fallback_reads_the_same_pages(tmp_path, monkeypatch):
    from app.documents import pdf

    monkeypatch.setattr(pdf, "pdfium", None)  # as without pypdfium2 installed
    path = make_pdf(tmp_path / "book.pdf", ["Opening page.", "An exam-\nple page.", FACT, "End."],
                    header="Sea Stories {page} / {pages}")
    doc = read_document(path)
    assert doc.pages == 4
    assert "Sea Stories" not in doc.text
    assert "[page 2]\nAn example page." in doc.text
    with pytest.raises(DocumentError, match="is password-protected"):
        read_document(make_encrypted_pdf(tmp_path / "locked.pdf", user_password="secret"))


def test_repeated_pages_are_not_headers():
    # The same text printed on every page (filler, forms): its edge lines repeat, but so does
    # everything beside them, which no running header has.
    page = ["The keeper climbed the stairs.", "She trimmed the wick.", "The lamp was lit.", "Night fell."]
    assert running_lines([page] * 6) == [set()] * 6
    with_header = [[f"Log {n}", f"Entry {n}: {WORDS[n]}", *page] for n in range(1, 7)]
    assert running_lines(with_header) == [{0}] * 6


def test_pdf_of_repeated_pages_keeps_every_line(tmp_path):
    text = "The keeper climbed the stairs and trimmed the wick. " * 12
    doc = read_document(make_pdf(tmp_path / "filler.pdf", [f"Chapter {n}. {text}" for n in range(4)]))
    assert " ".join(doc.text.split()).count("trimmed the wick") == 4 * 12


def test_printed_numbers_come_from_the_running_lines_at_the_documents_offset():
    pages = [f"Chapter 3. The Sea\nBody {n} of the {WORDS[n]}.\nMore {WORDS[n + 1]} text.\n{34 + n}" for n in range(6)]
    pages[0] = "Title page\nNothing printed here."
    assert printed_numbers(pages) == [None, 35, 36, 37, 38, 39]
    assert printed_numbers(["No numbers.", "At all here.", "None."]) == [None, None, None]


@pytest.mark.parametrize("reader", ["pdfium", "pypdf"])
def test_pdf_page_labels_become_the_page_markers(tmp_path, monkeypatch, reader):
    from app.documents import pdf
    from app.pages import join, split_pages

    if reader == "pypdf":
        monkeypatch.setattr(pdf, "pdfium", None)
    bodies = [f"Page body {n}: the {word}." for n, word in enumerate(WORDS[:6], start=1)]
    doc = read_document(make_labelled_pdf(tmp_path / "book.pdf", bodies, roman_pages=2, first_number=37))
    assert "[page i]\nPage body 1" in doc.text and "[page ii]\nPage body 2" in doc.text
    assert "[page 37]\nPage body 3" in doc.text and "[page 40]\nPage body 6" in doc.text
    assert split_pages(join([doc]))["37"].sequence == 3


def test_printed_footer_numbers_become_the_labels_before_the_footer_is_stripped(tmp_path):
    bodies = [f"Body of page {n}: the {word} stays." for n, word in enumerate(WORDS[:6], start=1)]
    doc = read_document(make_pdf(tmp_path / "chapter.pdf", bodies, header="Sea Stories", footer="{page}",
                                 first_number=35))
    assert "[page 35]\nBody of page 1" in doc.text and "[page 40]\nBody of page 6" in doc.text
    assert "Sea Stories" not in doc.text and "\n36\n" not in doc.text
