"""A read cut short by a restart continues from the shelf, in a real Chromium: the studio checkpoints a read onto
the shelf as it goes; after the studio stops mid-read and starts again, the saved list offers "Continue reading
(N%)" with what is left, and clicking it restores what was read and reads only the rest."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from lighthouse import PAGES
from make_files import make_pdf
from studio import served, slow_session, tab

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TIMEOUT_MS = 180_000


def _page(browser, url):
    return tab(browser, url, TIMEOUT_MS)


def _checkpointed(root: Path) -> int:
    from engine.store.format import HEADER_FILE, read_header

    headers = list(root.glob(f"*/{HEADER_FILE}"))
    return (read_header(headers[0].parent).num_read or 0) if headers else 0


def test_a_read_stopped_by_a_restart_continues_from_the_shelf(browser, tmp_path, monkeypatch):
    from app.saved import saved_docs as saved
    from engine import SnapshotStore

    monkeypatch.setattr(saved, "CHECKPOINT_EVERY_CHUNKS", 2)
    pdf = make_pdf(tmp_path / "kerrow-lighthouse.pdf", PAGES * 3)
    root = tmp_path / "kv"
    with served(slow_session(0.3), chunk_size=16, snapshot_store=SnapshotStore(root)) as url:
        page = _page(browser, url)
        page.locator("#file-drop input[type=file]").set_input_files(str(pdf))
        page.wait_for_selector("#plan .plan[data-fits=true]")
        page.click("#read")
        deadline = time.monotonic() + 120
        while _checkpointed(root) < 64 and time.monotonic() < deadline:
            page.wait_for_timeout(200)
        assert _checkpointed(root) >= 64
        assert page.get_attribute("#prefill-progress .progress", "data-state") == "running"
        page.context.close()  # the studio stops mid-read (the tab's read is abandoned with it)
    read_before = _checkpointed(root)

    with served(chunk_size=16, snapshot_store=SnapshotStore(root)) as url:  # a fresh start on the same shelf
        page = _page(browser, url)
        page.click("#saved-docs-section button:has-text('Saved documents'), #saved-docs-section .label-wrap")
        offer = page.wait_for_selector("#saved-docs .saved-partial")
        assert "Continue reading (" in offer.inner_text() and "tokens left" in offer.inner_text()
        page.click("#saved-choice input")
        page.click("[role=option]:has-text('kerrow-lighthouse.pdf')")
        page.wait_for_function("() => document.querySelector('#open-saved')?.innerText.includes('Continue reading')")
        page.click("#open-saved")
        page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('Saved for instant')")
        status = page.inner_text("#status")
        assert "the rest of" in status, status  # only what was left was read
        assert page.get_attribute("#prefill-progress .progress", "data-state") == "done"
        assert "kerrow-lighthouse.pdf" in page.inner_text("#files-table")
        [info] = SnapshotStore(root).list()
        assert not info.is_partial and info.num_tokens > read_before  # the whole read replaced the partial one
        page.wait_for_function("() => !document.querySelector('#saved-docs .saved-partial')")
        page.fill("#question textarea", "What is the secret launch code of the lighthouse?")
        page.click("#ask")
        page.wait_for_function("() => document.querySelectorAll('#chat .answer-stats').length >= 1")
