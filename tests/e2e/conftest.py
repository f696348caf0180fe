"""The studio served in-process on a free port with the embedded SmolLM2, for browser tests."""

import pytest
from studio import served
from test_browser import CHROMIUM, CHROMIUM_ARGS


@pytest.fixture(scope="session")
def studio_url():
    with served(chunk_size=16) as url:  # small chunks, so the progress bar visibly moves on a short document
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
