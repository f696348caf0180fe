"""A visitor kept apart (``--share`` without logins: a shelf per visitor) reloads the page, in a real Chromium, and
gets their document and conversation back: the reload's new session hash finds the browser's shelf by the browser's
own id (``app.browser_id``). Another visitor (another browser: no id of the first) sees nothing of it."""

from __future__ import annotations

import pytest
from lighthouse import PAGES
from make_files import make_pdf
from studio import read_and_ask, served, tab

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TIMEOUT_MS = 240_000


def test_a_visitors_reload_reopens_their_document_and_no_one_elses(browser, tmp_path):
    from app.uploads import prepare_folder
    from engine import SnapshotStore

    pdf = make_pdf(tmp_path / "kerrow-lighthouse.pdf", PAGES)
    visitors = prepare_folder(tmp_path / "visitors")
    with served(chunk_size=256, snapshot_store=SnapshotStore(tmp_path / "kv"), private=True,
                session_shelves=visitors) as url:
        page = tab(browser, url, TIMEOUT_MS)
        read_and_ask(page, pdf, "Who keeps the lighthouse?")
        page.wait_for_function("() => document.querySelectorAll('#chat .answer-stats').length >= 1 && "
                               "document.querySelector('#status')?.innerText.includes('tok/s')")
        page.wait_for_function("() => (sessionStorage.getItem('headinfer-studio-tab') || '').includes('Who keeps')")

        page.reload()
        page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('Reopened')")
        assert "kerrow-lighthouse.pdf" in page.inner_text("#files-table")
        assert "Who keeps the lighthouse?" in page.inner_text("#chat")
        assert page.get_attribute("#prefill-progress .progress", "data-state") == "done"
        assert page.evaluate("() => document.cookie") == ""  # the browser's id is HttpOnly: no script reads it

        # Another visitor's saved list is empty: the first visitor's shelf is theirs alone.
        other = tab(browser, url, TIMEOUT_MS)
        other.click("#saved-docs-section .label-wrap")
        other.wait_for_selector("#saved-docs .saved[data-count]")
        assert other.get_attribute("#saved-docs .saved[data-count]", "data-count") == "0"
        assert "kerrow-lighthouse.pdf" not in other.inner_text("#saved-docs")
