"""The studio served in-process on a free port with the embedded SmolLM2, for browser tests."""

import pytest
from chromium import CHROMIUM, CHROMIUM_ARGS
from studio import served, slow_session


@pytest.fixture(scope="session")
def studio_url():
    # Small chunks, so the progress bar visibly moves on a short document; answer tokens 0.1 s apart, so the page's
    # streaming state is there to see: the embedded model's fused decode step writes a 13-token answer in ~0.2 s,
    # faster than the page renders its "writing" state.
    with served(slow_session(0.0, 0.1), chunk_size=16) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium (no browser download), one per test module; each test opens its own contexts (tabs)."""
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium is not installed (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()
