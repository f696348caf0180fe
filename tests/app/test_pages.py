"""Pages of combined documents, and the pages an answer cites."""

from app.pages import Page, chip, cited_pages, split_pages
from engine.types import page_marker as marker

TEXT = ("=== manual.pdf ===\n[page 1]\nIntro text.\n\n[page 2]\nThe code is AMBER-7.\n\n"
        "=== notes.pdf ===\n[page 1]\nOther first page.\n\n[page 3]\nLast words.")


def test_pages_keep_their_file_and_the_first_file_keeps_a_shared_number():
    pages = split_pages(TEXT)
    assert pages["2"] == Page("manual.pdf", "The code is AMBER-7.", 2)
    assert pages["1"] == Page("manual.pdf", "Intro text.", 1)  # notes.pdf's page 1 does not replace it
    assert pages["3"] == Page("notes.pdf", "Last words.", 2)  # the second page of notes.pdf


def test_printed_labels_with_their_pdf_sequence():
    text = "=== book.pdf ===\n" + "\n\n".join(
        f"{marker(label, sequence)}\nText {sequence}." for sequence, label in
        enumerate([None, "iii", "1", "2"], start=1))
    pages = split_pages(text)
    assert list(pages) == ["PDF 1", "iii", "1", "2"]
    assert pages["2"] == Page("book.pdf", "Text 4.", 4)
    assert [chip(label) for label in pages] == ["PDF p. 1", "p. iii", "p. 1", "p. 2"]
    assert cited_pages("See p. 2 and page iii, not p. 4.", pages) == ["2", "iii"]


def test_citations_in_the_forms_models_write_them():
    pages = split_pages(TEXT)
    answer = "The code is AMBER-7 (p. 2), see also [page 3] and page 2; p. 99 does not exist."
    assert cited_pages(answer, pages) == ["2", "3"]
    assert cited_pages("No pages here.", pages) == []


def test_meters_show_host_attention_time_only_when_there_is_some():
    from app.meters import meters_html
    from engine import read_memory

    kv = {"kv_device": 0, "kv_host": 10, "kv_disk": 5, "context_tokens": 3, "max_context": 9}
    assert "Host attention" not in meters_html(read_memory(), kv)
    html = meters_html(read_memory(), {**kv, "host_attention_ms": 12.34})
    assert "Host attention" in html and "12.3 ms/token" in html and "host · disk" in html
