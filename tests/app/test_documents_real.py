"""app.documents on real books: manuals shipped in Debian packages (benchmarks.corpus).

The packages are downloaded once with ``apt-get download`` into pytest's cache; without apt or
network these tests skip and say why. Each book is read once per session.
"""

from __future__ import annotations

import re
import warnings

import pytest
from ebooklib import epub
from pypdf import PdfReader

from app.documents import read_document


@pytest.fixture(scope="session")
def read(real_documents):
    documents = {}

    def read_once(key):
        if key not in documents:
            documents[key] = read_document(real_documents[key])
        return documents[key]

    return read_once


def page_texts(text):
    """``{PDF page sequence: text}`` from the page markers (which hold the printed labels)."""
    parts = re.split(r"^\[(?:pdf )?page [^\]]+\]$", text, flags=re.MULTILINE)
    return {number: body.strip() for number, body in enumerate(parts[1:], start=1)}


@pytest.mark.parametrize("key", ["reference-pdf", "policy-pdf", "maint-guide-pdf", "faq-pdf"])
def test_real_pdf_every_page_marked_in_order(read, real_documents, key):
    doc = read(key)
    from app.pages import join, split_pages

    # One marker per page, in order, holding the number the book prints there (its PDF page label).
    markers = re.findall(r"^\[(?:pdf )?page ([^\]]+)\]$", doc.text, flags=re.MULTILINE)
    assert doc.pages == len(PdfReader(real_documents[key]).pages) > 40 and len(markers) == doc.pages
    assert "i" in markers and "ii" in markers  # the front matter, in roman numerals
    pages = split_pages(join([doc]))
    assert pages["20"].sequence > 20  # printed page 20 comes after the front matter
    assert "\ufffe" not in doc.text  # PDFium's line-end hyphen marker never reaches the prompt


@pytest.mark.parametrize("key", ["reference-pdf", "policy-pdf", "maint-guide-pdf"])
def test_real_latex_pdf_words_are_spaced(read, key):
    # pypdf reads these books as "Therearetwomethodsofassociatingafile": words longer than 20
    # letters were 1 in 60 words of the Debian Reference with it; real English has almost none.
    words = re.findall(r"[^\W\d_]+", read(key).text)
    run_together = [word for word in words if len(word) > 20]
    assert len(words) > 20_000
    assert len(run_together) < len(words) / 5_000, run_together[:20]


def test_real_pdf_sentence_reads_as_printed(read):
    pages = page_texts(read("reference-pdf").text)
    page = next(text for text in pages.values() if "two methods of associating a file" in text)
    assert "There are two methods of associating a file" in page


def test_real_pdf_running_header_and_page_numbers_removed(read):
    text = read("reference-pdf").text
    # Every page of the Debian Reference starts "Debian Reference 73 / 233" (roman numerals in front).
    assert not re.search(r"^Debian Reference (\d+ / \d+|[ivxlc]+)$", text, flags=re.MULTILINE)
    assert "Debian Reference\nOsamu Aoki" in text  # the title page's title is not a header
    pages = page_texts(text)
    assert sum(1 for body in pages.values() if body) > 0.95 * len(pages)


def test_real_pdf_alternating_footers_removed_headings_kept(read):
    text = read("policy-pdf").text
    lines = set(text.splitlines())
    assert "Debian Policy Manual, Release 4.6.2.0" not in lines  # header of every page
    # Footers alternate: "166 Chapter 22. Upgrading checklist" / "22.34. Version 3.7.3 167".
    assert not re.search(r"^\d+ Chapter \d+\. ", text, flags=re.MULTILINE)
    assert not re.search(r"^\d+(\.\d+)+\. .{3,60} \d+$", text, flags=re.MULTILINE)
    # Section headings at the top of a page are body text, not running headers.
    assert len(re.findall(r"^22\.\d+ Version \d", text, flags=re.MULTILINE)) > 20


def test_real_pdf_hyphenation_undone_compounds_kept(read):
    policy = read("policy-pdf").text
    reference = read("reference-pdf").text
    assert "respectively" in policy and "respec-tively" not in policy
    assert not re.search(r"\b(de-scribed|pack-ages|in-stallation|Sec-tion)\b", policy + reference)
    assert "time-consuming" in reference  # broken at its own hyphen, never written "timeconsuming"
    assert "timeconsuming" not in reference
    assert "fonts-crosextra-carlito" in reference  # a package name broken across lines


def test_real_epub_chapters_in_spine_order_with_titles(read, real_documents):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        book = epub.read_epub(str(real_documents["policy-epub"]), options={"ignore_ncx": True})
    manifest = [item.get_id() for item in book.get_items_of_type(9)]  # ebooklib.ITEM_DOCUMENT
    spine = [idref for idref, _ in book.spine]
    assert [i for i in manifest if i in spine] != spine  # the manifest order would be wrong

    text = read("policy-epub").text
    titles = ["# 1. About this manual", "# 2. The Debian Archive", "# 3. Binary packages",
              "# 4. Source packages", "# 5. Control files and their fields", "# 10. Files"]
    positions = [text.index(f"\n{title}\n") for title in titles]
    assert positions == sorted(positions)
    assert "<p>" not in text and "¶" not in text


def test_real_docbook_html_main_text(read):
    text = read("reference-html").text
    assert text.startswith("# Chapter 5. Network setup\n")
    lines = text.splitlines()
    assert not {"Prev", "Next", "Home", "Up"} & set(lines)  # DocBook's navheader / navfooter
    assert "## 5.1. The basic network infrastructure" in lines
    assert "Although these were written for Linux 2.4, both iptables(8) command" in text


def test_real_sphinx_html_main_text(read):
    text = read("policy-html").text
    assert text.startswith("# 10. Files\n\n## 10.1. Binaries\n")
    for boilerplate in ("Quick search", "Navigation", "¶", "previous |", "Table of Contents"):
        assert boilerplate not in text


def test_real_pdf_section_running_heads_removed(read):
    # LaTeX's book class heads each page "CHAPTER 7. BASICS OF THE DEBIAN PACKAGE… 7.5. WHAT IS A
    # DEBIAN CONFFILE?": a different line for every section, all capitals, page number at the foot.
    text = read("faq-pdf").text
    assert not re.search(r"^CHAPTER \d+\. ", text, flags=re.MULTILINE)
    pages = page_texts(text).values()
    # Uncleaned, 64 of 73 pages end with a lone page number (footnote marks are lone numbers too).
    assert sum(1 for body in pages if re.search(r"\n\d+$", body)) < 0.05 * len(pages)
    assert "7.7 What is an Essential, Required, Important, Standard, Optional," in text
