"""A first start's plan in a real Chromium: the reading time says "estimating…" while this machine's reading cost is
measured in the background, and becomes the measured estimate when the measurement lands, with no click."""

from __future__ import annotations

import threading

import pytest
from chromium import CHROMIUM, CHROMIUM_ARGS
from make_files import make_pdf
from studio import served

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def measuring(monkeypatch):
    """The background measurement, held until the test releases it; then it lands a rate (as ``launch.py``'s
    would, through the real background thread and its record)."""
    from engine.read_time import estimator as estimator_module
    from engine.read_time.read_rate import ReadRate

    started, release = threading.Event(), threading.Event()

    def held_measurement(model, vocab_size, forward, probe, should_stop, give_way=None, **_):
        started.set()
        while not release.wait(0.05):
            if should_stop():
                return None
        return ReadRate(0.5, 2e-3, 4e-7, probe())

    monkeypatch.setattr(estimator_module, "measure_read_rate", held_measurement)
    return started, release


@pytest.fixture
def url(measuring):
    from engine import DocumentSession
    from engine.read_time.costs import ReadCosts

    class FirstStartSession(DocumentSession):
        """A clean cache: no read recorded, no reading cost kept (the test process's shared file may hold some)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, read_costs=ReadCosts(None), **kwargs)

    with served(FirstStartSession, chunk_size=256) as address:
        yield address


def test_estimating_is_replaced_by_the_measured_estimate_without_a_click(url, measuring, tmp_path):
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium is not installed (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    started, release = measuring
    pdf = make_pdf(tmp_path / "keeper.pdf", ["The lighthouse stands on a cape.", "Its keeper is Mara."])
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(120_000)
            page.goto(url)
            page.locator("#file-drop input[type=file]").set_input_files(str(pdf))
            page.wait_for_selector("#plan .plan[data-fits=true]")
            plan = page.locator("#plan .plan").inner_text()
            assert "estimating…" in plan and "measuring this machine's reading speed" in plan, plan
            assert started.wait(30)  # the upload's estimate started the measurement; it is held meanwhile
            page.wait_for_timeout(2500)  # two timer ticks: still measuring, still "estimating…"
            assert "estimating…" in page.locator("#plan .plan").inner_text()
            release.set()  # the measurement lands; nobody touches the page
            page.wait_for_function("() => { const p = document.querySelector('#plan .plan');"
                                   " return p && !p.innerText.includes('estimating') && p.innerText.includes('≈'); }",
                                   timeout=30_000)
            plan = page.locator("#plan .plan").inner_text()
            assert "Reading time" in plan and "Fits" in plan, plan
        finally:
            browser.close()
