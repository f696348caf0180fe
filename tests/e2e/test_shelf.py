"""The shelf opens, in a real Chromium: a read document saved to disk reopens from the saved list in another tab
with no upload, and a page reload keeps the tab's document and its conversation."""

from __future__ import annotations

import pytest
from lighthouse import PAGES
from make_files import make_pdf
from studio import read_and_ask, served, tab

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TIMEOUT_MS = 180_000


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    from engine import SnapshotStore

    with served(chunk_size=256, snapshot_store=SnapshotStore(tmp_path_factory.mktemp("kv"))) as url:
        yield url


def _page(browser, url):
    return tab(browser, url, TIMEOUT_MS)


def _answered(page, count: int) -> None:
    page.wait_for_function(f"() => document.querySelectorAll('#chat .answer-stats').length >= {count} && "
                           "document.querySelector('#status')?.innerText.includes('tok/s')")


def test_a_saved_document_reopens_from_the_list_and_after_a_reload(browser, url, tmp_path):
    pdf = make_pdf(tmp_path / "kerrow-lighthouse.pdf", PAGES)
    page = _page(browser, url)
    read_and_ask(page, pdf, "Who keeps the lighthouse?")
    _answered(page, 1)
    page.wait_for_function("() => (sessionStorage.getItem('headinfer-studio-tab') || '').includes('Who keeps')")

    # A reload keeps the tab's document and its conversation, reopened from disk.
    page.reload()
    page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('Reopened')")
    assert "kerrow-lighthouse.pdf" in page.inner_text("#files-table")
    assert "Who keeps the lighthouse?" in page.inner_text("#chat")
    assert page.get_attribute("#prefill-progress .progress", "data-state") == "done"
    page.fill("#question textarea", "How many steps does she climb?")
    page.click("#ask")
    _answered(page, 1)

    # Another tab opens it from the saved list: no file is dropped.
    other = _page(browser, url)
    other.click("#saved-docs-section button:has-text('Saved documents'), #saved-docs-section .label-wrap")
    other.wait_for_selector("#saved-docs tr[data-key]")
    other.click("#saved-choice input")
    other.click("[role=option]:has-text('kerrow-lighthouse.pdf')")
    other.click("#open-saved")
    other.wait_for_function("() => document.querySelector('#status')?.innerText.includes('Reopened')")
    assert other.locator("#file-drop input[type=file]").evaluate("input => input.files.length") == 0
    assert "kerrow-lighthouse.pdf" in other.inner_text("#files-table")
    assert "Host memory" in other.inner_text("#plan")
    other.fill("#question textarea", "What is the secret launch code of the lighthouse?")
    other.click("#ask")
    _answered(other, 1)
    sources = other.locator("#chat .answer-sources")
    if sources.count():  # the page chips work on a reopened document: its page map came back with it
        other.locator("#page-chips label").first.click()
        other.wait_for_selector("#page-view .page-view[data-page]")
