"""Pages of combined documents, and the pages an answer cites."""

from app.pages import cited_pages, split_pages

TEXT = ("=== manual.pdf ===\n[page 1]\nIntro text.\n\n[page 2]\nThe code is AMBER-7.\n\n"
        "=== notes.pdf ===\n[page 1]\nOther first page.\n\n[page 3]\nLast words.")


def test_pages_keep_their_file_and_the_first_file_keeps_a_shared_number():
    pages = split_pages(TEXT)
    assert pages[2] == ("manual.pdf", "The code is AMBER-7.")
    assert pages[1] == ("manual.pdf", "Intro text.")  # notes.pdf's page 1 does not replace it
    assert pages[3] == ("notes.pdf", "Last words.")


def test_citations_in_the_forms_models_write_them():
    pages = split_pages(TEXT)
    answer = "The code is AMBER-7 (p. 2), see also [page 3] and page 2; p. 99 does not exist."
    assert cited_pages(answer, pages) == [2, 3]
    assert cited_pages("No pages here.", pages) == []


def test_meters_show_host_attention_time_only_when_there_is_some():
    from app.meters import meters_html
    from engine import read_memory

    kv = {"kv_device": 0, "kv_host": 10, "kv_disk": 5, "context_tokens": 3, "max_context": 9}
    assert "Host attention" not in meters_html(read_memory(), kv)
    html = meters_html(read_memory(), {**kv, "host_attention_ms": 12.34})
    assert "Host attention" in html and "12.3 ms/token" in html and "host · disk" in html
