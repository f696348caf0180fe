"""What the page says holds across a restart, in a real Chromium (issue 51): the studio is stopped and started again on
the same port over the same shelf, the tab reloads, and its chat comes back with each answer's stats line and
sources as they were shown; one count of the read's tokens on the screen; "Read documents" off once read; Clear
takes the page chips and the viewer with the documents."""

from __future__ import annotations

import pytest
from lighthouse import PAGES
from make_files import make_pdf
from ports import free_port
from studio import read_and_ask, served, tab

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TIMEOUT_MS = 240_000


def _answered(page) -> None:
    page.wait_for_function("() => document.querySelectorAll('#chat .answer-stats').length >= 1 && "
                           "document.querySelector('#status')?.innerText.includes('tok/s')")


def test_a_restart_restores_the_chat_as_shown_and_the_screen_agrees(browser, tmp_path):
    from engine import SnapshotStore

    pdf = make_pdf(tmp_path / "kerrow-lighthouse.pdf", PAGES)
    port, store = free_port(), tmp_path / "kv"
    with served(chunk_size=256, snapshot_store=SnapshotStore(store), port=port) as url:
        page = tab(browser, url, TIMEOUT_MS)
        read_and_ask(page, pdf, "Who keeps the lighthouse?")
        _answered(page)
        stats = page.inner_text("#chat .answer-stats")
        sources = page.locator("#chat .answer-sources").all_inner_texts()
        read_tokens = int(page.get_attribute("#files-table .files-scroll", "data-read-tokens"))
        assert read_tokens == int(page.get_attribute("#plan .plan", "data-tokens"))  # one count of the read
        assert read_tokens == int(page.get_attribute("#prefill-progress .progress", "data-total"))
        assert "read in" in page.inner_text("#plan")  # the plan after the read says what it took
        assert page.is_disabled("#read")  # nothing new to read
        page.wait_for_function("() => (sessionStorage.getItem('headinfer-studio-tab') || '').includes('Who keeps')")

    with served(chunk_size=256, snapshot_store=SnapshotStore(store), port=port):  # the app started again
        page.reload()
        page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('Reopened')")
        assert "Who keeps the lighthouse?" in page.inner_text("#chat")
        assert page.inner_text("#chat .answer-stats") == stats  # its TTFT, tokens and rate as they were
        assert page.locator("#chat .answer-sources").all_inner_texts() == sources
        assert page.is_disabled("#read")
        assert "with the prompt" in page.inner_text("#files-table")

        page.fill("#question textarea", "How many steps does she climb?")
        page.click("#ask")
        page.wait_for_function("() => document.querySelectorAll('#chat .answer-stats').length >= 2 && "
                               "document.querySelector('#status')?.innerText.includes('tok/s')")
        if page.locator("#page-chips label").count():
            page.locator("#page-chips label").first.click()
            page.wait_for_selector("#page-view .page-view[data-page]")
        page.click("#clear")
        page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('cleared')")
        page.wait_for_function("() => !document.querySelector('#page-chips label')")
        assert page.locator("#page-view .page-view.empty").count() == 1
