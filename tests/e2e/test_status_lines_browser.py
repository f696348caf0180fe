"""What a newcomer reads, in a real Chromium: a plan that fits says so without "longer texts need a long-context
model" under it and shows the documents' share beside the conversation's; the page chips of the previous document go
when another is read; with one saved document, Open opens it with no choosing (one browser, one short run)."""

from __future__ import annotations

import pytest
from chromium import CHROMIUM, CHROMIUM_ARGS
from make_files import make_pdf
from studio import read_and_ask, served

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ANSWER = "The keeper is named on page 2 (see also p. 1)."


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    from engine import DocumentSession, SnapshotStore
    from engine.types import AnswerChunk

    class CitingSession(DocumentSession):
        """Reads (and saves) for real; answers at once, citing two pages, so chips appear."""

        def ask(self, question, **kwargs):
            yield AnswerChunk(ANSWER, ANSWER, 12, 0.1, 10.0, done=True)

    store = SnapshotStore(tmp_path_factory.mktemp("kv"))
    with served(CitingSession, chunk_size=256, snapshot_store=store) as address:
        yield address


def _status(page) -> str:
    return page.locator("#status").inner_text()


def test_plan_chips_and_open_say_what_is_true(url, tmp_path):
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium is not installed (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    keeper = make_pdf(tmp_path / "keeper.pdf", ["The lighthouse stands on a cape.", "Its keeper is Mara."])
    tides = make_pdf(tmp_path / "tides.pdf", ["Tides rise twice a day.", "And fall twice."])
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.set_default_timeout(120_000)
        page.goto(url)
        read_and_ask(page, keeper, "Who keeps the lighthouse?")
        plan = page.locator("#plan .plan").inner_text()
        assert "Fits" in plan and "long-context model" not in plan, plan
        assert "Documents' share" in plan and "6,144 tokens · 2,048 kept for the conversation" in plan, plan
        page.wait_for_selector("#page-chips label")

        # Another document, read without saving it: the first one's chips go with it.
        # Wait for the new set's plan, not the first one's (which also says "Fits"): a click on Read before the
        # upload's plan lands would read the old set, and the upload's status would then say "Ready to read".
        first_tokens = page.locator("#plan .plan").get_attribute("data-tokens")
        page.click("#remember input")
        page.locator("#file-drop input[type=file]").set_input_files(str(tides))
        page.wait_for_function("(first) => { const plan = document.querySelector('#plan .plan');"
                               " return plan && plan.dataset.tokens && plan.dataset.tokens !== first"
                               " && plan.innerText.includes('Fits'); }", arg=first_tokens)
        page.click("#read")
        page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('Ask a question')")
        page.wait_for_selector("#page-chips", state="hidden")

        # One saved document (keeper.pdf): Open opens it, nothing to choose first.
        page.click("#saved-docs-section button:has-text('Saved documents'), #saved-docs-section .label-wrap")
        page.wait_for_selector("#saved-docs tr[data-key]")
        assert page.locator("#saved-docs tr[data-key]").count() == 1
        page.click("#open-saved")
        page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('Reopened')")
        assert "Reopened keeper.pdf" in _status(page) and "Choose a saved document" not in _status(page)
        browser.close()
