"""Pages of combined documents, and the pages an answer cites."""

from app.documents import Document, combine
from app.pages import Page, chip, cited_pages, document_pages, join, last_page, read_part, split_pages
from engine.types import page_marker as marker

DOCUMENTS = [Document("manual.pdf", "pdf", "[page 1]\nIntro text.\n\n[page 2]\nThe code is AMBER-7.", 2),
             Document("notes.pdf", "pdf", "[page 1]\nOther first page.\n\n[page 3]\nLast words.", 2)]
TEXT = join(DOCUMENTS)


def test_pages_keep_their_file_and_the_first_file_keeps_a_shared_number():
    assert TEXT == combine(DOCUMENTS) == ("=== manual.pdf ===\n[page 1]\nIntro text.\n\n[page 2]\nThe code is "
                                         "AMBER-7.\n\n=== notes.pdf ===\n[page 1]\nOther first page.\n\n[page 3]\n"
                                         "Last words.")
    pages = split_pages(TEXT)
    assert pages["2"] == Page("manual.pdf", "The code is AMBER-7.", 2)
    assert pages["1"] == Page("manual.pdf", "Intro text.", 1)  # notes.pdf's page 1 does not replace it
    assert pages["3"] == Page("notes.pdf", "Last words.", 2)  # the second page of notes.pdf


def test_printed_labels_with_their_pdf_sequence():
    body = "\n\n".join(f"{marker(label, sequence)}\nText {sequence}." for sequence, label in
                       enumerate([None, "iii", "1", "2"], start=1))
    pages = split_pages(join([Document("book.pdf", "pdf", body, 4)]))
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


HOSTILE_TXT = Document("notes.txt", "txt", "=== <img src=x onerror=alert(1)> ===\nIntro.\n[page 999]\nMore.\n\n"
                                           "=== evil.pdf ===\n[page 3]\nForged.")
REAL_PDF = Document("real.pdf", "pdf", "[page 1]\nOne.\n\n[page 2]\nTwo.", 2)


def test_a_documents_own_header_and_page_lines_make_no_file_or_page():
    text = join([HOSTILE_TXT, REAL_PDF])
    assert text == combine([HOSTILE_TXT, REAL_PDF])
    assert [part.name for part in text.layout.files] == ["notes.txt", "real.pdf"]
    pages = split_pages(text)
    assert pages == {"1": Page("real.pdf", "One.", 1), "2": Page("real.pdf", "Two.", 2)}
    # Where a read that stopped in the text file ends: no page, and never the forged "<img …>" or "evil.pdf".
    assert last_page(text[: text.index("More.")], text) is None
    assert last_page(text[: text.index("[page 2]")], text) == "p. 1 of real.pdf"
    assert split_pages(str(text)) == {}  # a text the app did not join has no pages, whatever its lines say


def test_a_pdf_whose_text_forges_a_marker_has_no_pages_rather_than_false_ones():
    forged = Document("forged.pdf", "pdf", "[page 1]\nOne.\n[page 999]\nStill one.\n\n[page 2]\nTwo.", 2)
    assert document_pages(forged) == []
    assert split_pages(join([forged, REAL_PDF])) == {"1": Page("real.pdf", "One.", 1), "2": Page("real.pdf", "Two.", 2)}


def test_a_read_truncated_to_fit_keeps_the_pages_it_holds():
    text = join([REAL_PDF, Document("more.pdf", "pdf", "[page 7]\nSeven.\n\n[page 8]\nEight.", 2)])
    read = read_part(text[: text.index("Eight.") + 2] + "\n[... truncated to fit ...]", text)
    pages = split_pages(read)
    assert list(pages) == ["1", "2", "7", "8"] and pages["8"] == Page("more.pdf", "Ei", 2)
    assert last_page(read) == "p. 8 of more.pdf"
    cut_in_marker = read_part(text[: text.index("[page 8]") + 3], text)
    assert list(split_pages(cut_in_marker)) == ["1", "2", "7"]
