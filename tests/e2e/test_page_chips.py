"""A real Chromium shows the chosen citation chip legibly: its label's computed text and background
colours have a WCAG contrast ratio of at least 4.5:1, in the light theme and the dark one."""

from __future__ import annotations

import re

import pytest
from chromium import CHROMIUM, CHROMIUM_ARGS
from make_files import make_pdf
from studio import read_and_ask, served

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ANSWER = "The keeper is named on page 2 (see also p. 1)."
WCAG_AA = 4.5  # normal-size text
# The chip label's text colour (its span's, which is what is read) and its own background.
COLOURS = """label => ({color: getComputedStyle(label.querySelector('span') || label).color,
                       background: getComputedStyle(label).backgroundColor,
                       dark: document.body.classList.contains('dark')})"""


@pytest.fixture(scope="module")
def citing_url():
    from engine import DocumentSession
    from engine.types import AnswerChunk

    class CitingSession(DocumentSession):
        """Reads for real; answers at once with an answer that cites two pages, so chips appear."""

        def ask(self, question, **kwargs):
            yield AnswerChunk(ANSWER, ANSWER, 12, 0.1, 10.0, done=True)

    with served(CitingSession, chunk_size=256) as url:
        yield url


def _rgba(css: str) -> tuple[float, float, float, float]:
    channels = [float(x) for x in re.findall(r"[\d.]+", css)]
    return (*channels[:3], channels[3] if len(channels) > 3 else 1.0)


def _luminance(rgb) -> float:
    def linear(channel: float) -> float:
        c = channel / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast_ratio(foreground: str, background: str) -> float:
    """WCAG 2 contrast ratio of two opaque CSS ``rgb(...)`` colours."""
    lighter, darker = sorted((_luminance(_rgba(foreground)), _luminance(_rgba(background))), reverse=True)
    return (lighter + 0.05) / (darker + 0.05)


def test_contrast_ratio_matches_wcag_examples():
    assert contrast_ratio("rgb(0, 0, 0)", "rgb(255, 255, 255)") == pytest.approx(21.0)
    assert contrast_ratio("rgb(255, 255, 255)", "rgb(20, 184, 166)") == pytest.approx(2.49, abs=0.01)


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_chosen_page_chip_is_legible(citing_url, tmp_path, theme):
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium is not installed (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    pdf = make_pdf(tmp_path / "keeper.pdf", ["The lighthouse stands on a cape.", "Its keeper is Mara."])
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(color_scheme=theme)
        page.set_default_timeout(120_000)
        page.goto(f"{citing_url}?__theme={theme}")
        read_and_ask(page, pdf, "Who keeps the lighthouse?")
        page.locator("#page-chips label").first.click()
        page.wait_for_selector("#page-view .page-view[data-page='2']")
        chip = page.locator("#page-chips label.selected")
        assert chip.inner_text().strip() == "p. 2"
        measured = {}
        for where in ("under the pointer", "at rest"):
            if where == "at rest":
                page.mouse.move(0, 0)
            chip.evaluate("label => Promise.all(label.getAnimations({subtree: true}).map(a => a.finished))")
            measured[where] = chip.evaluate(COLOURS)
        browser.close()
    for where, colours in measured.items():
        assert colours["dark"] == (theme == "dark"), colours  # the theme asked for is the one measured
        assert _rgba(colours["background"])[3] == 1.0, (where, colours)  # opaque: the ratio is the one seen
        assert contrast_ratio(colours["color"], colours["background"]) >= WCAG_AA, (where, colours)
