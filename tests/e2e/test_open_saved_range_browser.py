"""Opening a saved document from the shelf, in a real Chromium, after an upload too long to read whole offered its
page range: the tab then holds the saved document, and the earlier upload's range picker goes with the upload
(issue 51, clear means clear)."""

from __future__ import annotations

import pytest
from chromium import chromium_page
from lighthouse import PAGES
from make_files import make_pdf
from studio import served

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TIMEOUT_MS = 240_000
FILLER = ("The keeper walked along the harbour wall, counted the boats and wrote the weather in her logbook. " * 9)


@pytest.fixture
def page(tmp_path_factory):
    from engine import SnapshotStore

    store = SnapshotStore(tmp_path_factory.mktemp("kv"))
    with served(chunk_size=256, snapshot_store=store) as url, \
            chromium_page(url, height=1000, timeout_ms=TIMEOUT_MS) as page:
        yield page


def test_opening_a_saved_document_takes_the_earlier_uploads_page_range_away(page, tmp_path):
    small = make_pdf(tmp_path / "kerrow-lighthouse.pdf", PAGES)
    page.locator("#file-drop input[type=file]").set_input_files(str(small))
    page.wait_for_selector("#plan .plan[data-fits=true]")
    page.click("#read")
    page.wait_for_selector("#prefill-progress .progress[data-state=done]")
    page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('Saved')")

    book = make_pdf(tmp_path / "harbour-book.pdf", [f"Chapter page {n}. {FILLER}" for n in range(40)])
    page.locator("#file-drop input[type=file]").set_input_files(str(book))
    page.wait_for_selector("#plan .plan[data-fits=false]")
    page.wait_for_selector("#page-range #range-from", state="visible")

    page.click("#saved-docs-section button:has-text('Saved documents'), #saved-docs-section .label-wrap")
    page.wait_for_selector("#saved-docs tr[data-key]")
    page.click("#saved-choice input")
    page.click("[role=option]:has-text('kerrow-lighthouse.pdf')")
    page.click("#open-saved")
    page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('Reopened')")
    assert "kerrow-lighthouse.pdf" in page.inner_text("#files-table")
    assert "harbour-book.pdf" not in page.inner_text("#files-table")
    # The range picker goes once the open's events are done (it was the book's pages, unchecked, before).
    page.wait_for_selector("#page-range #range-from", state="hidden", timeout=15_000)
