"""Debian's Chromium for the browser tests (no browser download): where it is, the flags it runs with, one page."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
TIMEOUT_MS = 120_000


@contextmanager
def chromium_page(url: str, *, height: int = 800, timeout_ms: int = TIMEOUT_MS):
    """A page of Debian's Chromium (no browser download) at ``url``, 1280 x ``height``; skips without Chromium."""
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium is not installed (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1280, "height": height}).new_page()
        page.set_default_timeout(timeout_ms)
        page.goto(url)
        yield page
        browser.close()
