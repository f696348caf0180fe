"""A way into a whole book, in a real Chromium: a labelled PDF (its /PageLabels written by pypdf) too long for the
model's window offers a page range with a live token count, and the files table counts the chosen range; the range
read cites the book's printed page numbers, and the page viewer shows the PDF page as a tooltip; reopened from the
shelf in another tab, the files table shows the range's pages and characters, not the whole book's."""

from __future__ import annotations

import pytest
from chromium import chromium_page
from make_files import make_labelled_pdf
from studio import served, tab

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TIMEOUT_MS = 240_000
ROMAN, FIRST = 4, 30  # four pages of front matter (i-iv), then the body printed from page 30
FILLER = ("The keeper walked along the harbour wall, counted the boats and wrote the weather in her logbook. " * 9)


def _pages() -> list[str]:
    pages = [f"Front matter {n}. {FILLER}" for n in range(ROMAN)]
    for printed in range(FIRST, FIRST + 36):
        fact = " The secret launch code of the lighthouse is AMBER-7." if printed == 41 else ""
        pages.append(f"Chapter page {printed}.{fact} {FILLER}")
    return pages


@pytest.fixture
def page(tmp_path_factory):
    from engine import SnapshotStore

    store = SnapshotStore(tmp_path_factory.mktemp("kv"))
    with served(chunk_size=256, snapshot_store=store) as url, \
            chromium_page(url, height=1000, timeout_ms=TIMEOUT_MS) as page:
        yield page


def _file_row(page) -> tuple[int, int]:
    """(pages, characters) of the files table's first file."""
    cells = page.locator("#files-table tr:has(td.file-name) td")
    return int(cells.nth(1).inner_text()), int(cells.nth(2).inner_text().replace(",", ""))


def _pick(page, which: str, label: str) -> None:
    page.click(f"#{which} input")
    page.click(f"[role=option]:text-is('{label}')")


def test_a_page_range_of_a_labelled_book_cites_printed_page_numbers(page, tmp_path):
    pdf = make_labelled_pdf(tmp_path / "kerrow-book.pdf", _pages(), roman_pages=ROMAN, first_number=FIRST)
    page.locator("#file-drop input[type=file]").set_input_files(str(pdf))
    page.wait_for_selector("#plan .plan[data-fits=false]")
    page.wait_for_selector("#page-range #range-from")
    whole_pages, whole_chars = _file_row(page)
    assert whole_pages == len(_pages())
    assert "page range" in page.inner_text("#status")

    # "First part that fits" picks a range from the first page whose live count fits.
    page.click("#first-part")
    page.wait_for_selector("#range-info .range-info[data-fits=true]")
    assert "p. i – p. " in page.inner_text("#range-info")

    # A range in the body, by printed page numbers: counted live, then read.
    _pick(page, "range-from", "p. 38")
    _pick(page, "range-to", "p. 44")
    page.wait_for_function("() => document.querySelector('#range-info').innerText.startsWith('p. 38 – p. 44')")
    info = page.locator("#range-info .range-info")
    assert info.get_attribute("data-fits") == "true" and int(info.get_attribute("data-tokens")) < 7168
    # The files table beside it counts what is to be read: the range's seven pages and its tokens, not the book's.
    page.wait_for_function("() => document.querySelector('#files-table')?.innerText.includes('p. 38 – p. 44')")
    pages, chars = _file_row(page)
    assert pages == 7 and chars < whole_chars / 4, (pages, chars, whole_chars)
    assert page.get_attribute("#files-table .files-scroll", "data-read-tokens") == info.get_attribute("data-tokens")
    page.wait_for_selector("#plan .plan[data-fits=true]")
    page.click("#read")
    page.wait_for_selector("#prefill-progress .progress[data-state=done]")
    assert "Read p. 38 – p. 44 of kerrow-book.pdf" in page.inner_text("#status")

    page.fill("#question textarea", "What is the secret launch code of the lighthouse?")
    page.click("#ask")
    page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('tok/s')")
    sources = page.locator("#chat .answer-sources").last
    cited = [int(part.split()[1]) for part in sources.inner_text().removeprefix("Sources: ").split(" · ")]
    assert all(38 <= number <= 44 for number in cited), cited  # printed numbers, not PDF pages 13-19
    assert sources.locator("span[title^='PDF page']").count() == len(cited)
    page.locator("#page-chips label").first.click()
    page.wait_for_selector("#page-view .page-view[data-page]")
    shown = int(page.get_attribute("#page-view .page-view", "data-page"))
    assert page.get_attribute("#page-view .page-title", "title") == f"PDF page {shown - FIRST + ROMAN + 1}"  # its place in the whole PDF
    assert f"p. {shown}" in page.inner_text("#page-view .page-title")

    # Reopened from the shelf in a fresh tab: the files table is the range's (7 pages), not the whole book's.
    other = tab(page.context.browser, page.url, TIMEOUT_MS, height=1000)
    other.click("#saved-docs-section button:has-text('Saved documents'), #saved-docs-section .label-wrap")
    other.wait_for_selector("#saved-docs tr[data-key]")
    other.click("#open-saved")
    other.wait_for_function("() => document.querySelector('#status')?.innerText.includes('Reopened')")
    pages, chars = _file_row(other)
    assert pages == 7 and chars < whole_chars / 4, (pages, chars, whole_chars)
