"""“Read documents” and the plan's reading time in a real Chromium (issue 51): a set too long with Truncate off and
no range leaves Read off, Truncate or a page range that fits turns it on; while the read runs the plan's reading time
gives way to the progress bar's countdown, once read the plan says the read's time and Read is off; Clear documents
takes the plan and the page range with it and leaves Read off. Documents here may take 224
tokens, so that a four-page PDF is too long and one of its pages fits."""

from __future__ import annotations

import dataclasses

import pytest
from chromium import chromium_page
from make_files import make_pdf
from studio import served, slow_session

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

@pytest.fixture
def url(monkeypatch):
    from engine.read_time import estimator as estimator_module
    from engine.read_time.read_rate import ReadRate

    # This machine's reading cost known at once: the read starts when pressed, not after a first start's measurement.
    monkeypatch.setattr(estimator_module, "measure_read_rate",
                        lambda model, vocab_size, forward, probe, should_stop, **_: ReadRate(0.5, 2e-3, 4e-7, probe()))

    class Small(slow_session(0.4, 0.0)):  # chunks 0.4 s apart: the read runs long enough to be seen
        def __init__(self, model, tokenizer, policy):
            super().__init__(model, tokenizer, dataclasses.replace(policy, max_context=288), answer_budget=64)

    with served(Small, chunk_size=16) as address:
        yield address


def _pick(page, which: str, label: str) -> None:
    page.click(f"#{which} input")
    page.click(f"[role=option]:text-is('{label}')")


def _reading_time(page) -> str:
    return page.evaluate("() => [...document.querySelectorAll('#plan .plan-grid div')]"
                         ".find(d => d.querySelector('span')?.innerText === 'Reading time')?.querySelector('b')"
                         "?.innerText || ''")


def test_read_is_offered_when_it_would_read_and_the_read_shows_one_estimate(url, tmp_path):
    pdf = make_pdf(tmp_path / "tides.pdf", [f"Chapter {n}. " + "The tide rises and falls twice a day. " * 9
                                            for n in range(4)])
    with chromium_page(url, height=1400, timeout_ms=180_000) as page:
        page.locator("#file-drop input[type=file]").set_input_files(str(pdf))
        page.wait_for_selector("#plan .plan[data-fits=false]")
        page.wait_for_selector("#page-range #range-from")
        assert page.is_disabled("#read")  # too long, Truncate off, no range: nothing it could read
        page.check("#truncate input")
        page.wait_for_selector("#read:not([disabled])")
        page.uncheck("#truncate input")
        page.wait_for_selector("#read[disabled]")

        _pick(page, "range-from", "p. 2")
        _pick(page, "range-to", "p. 2")
        page.wait_for_selector("#range-info .range-info[data-fits=true]")
        page.wait_for_selector("#read:not([disabled])")
        page.wait_for_selector("#plan .plan[data-fits=true]")
        assert _reading_time(page).startswith(("≈", "estimating…"))  # the forecast, before anything runs

        page.click("#read")
        page.wait_for_selector("#prefill-progress .progress[data-state=running]")
        page.wait_for_function("() => document.querySelector('#prefill-progress').innerText.includes('ETA')")
        during = _reading_time(page)  # beside the bar's measured countdown: no second figure
        assert during == "reading now: the countdown is on the progress bar", during
        page.wait_for_selector("#prefill-progress .progress[data-state=done]")
        page.wait_for_function("() => document.querySelector('#plan .plan')?.dataset.readSeconds !== undefined")
        assert _reading_time(page).startswith("read in ")
        assert page.is_disabled("#read")  # the range is read: nothing new

        page.click("#clear")
        page.wait_for_function("() => document.querySelector('#status').innerText.includes('Documents cleared')")
        page.wait_for_selector("#page-range", state="hidden")
        assert page.locator("#plan .plan[data-fits='']").count() == 1  # the empty plan
        assert page.is_disabled("#read")


def test_clear_documents_takes_the_answers_page_chips_and_viewer(tmp_path):
    from studio import read_and_ask

    pdf = make_pdf(tmp_path / "keeper.pdf", ["The lighthouse stands on a cape.", "Its keeper is Mara."])
    with served(chunk_size=64) as address, chromium_page(address, height=1400, timeout_ms=180_000) as page:
        read_and_ask(page, pdf, "Who keeps the lighthouse?")  # its sources: the pages the answer attended to
        page.wait_for_selector("#page-chips label")
        page.locator("#page-chips label").first.click()
        page.wait_for_selector("#page-view .page-view[data-page]")
        page.click("#clear")
        page.wait_for_function("() => document.querySelector('#status').innerText.includes('Documents cleared')")
        page.wait_for_selector("#page-chips", state="hidden")
        assert page.locator("#page-view .page-view[data-page]").count() == 0
        assert page.is_disabled("#read")
