"""Tries the studio as a new user would on a real book, in a real Chromium, and keeps screenshots.

    .venv/bin/python scripts/screenshots_real_pdf.py [--pdf PATH] [--question TEXT]

Default book: the Debian FAQ (a 73-page LaTeX PDF from the ``debian-faq`` package, fetched into the test
cache by ``benchmarks.corpus``). It is longer than the embedded SmolLM2's 8,192-token window, so the plan
says so and "Truncate to fit" reads the beginning. Screenshots go to docs/screenshots/07-*.png ... 09-*.png.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHOTS = ROOT / "docs" / "screenshots"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pdf", default=None)
    parser.add_argument("--question", default="What is Debian? Answer in one sentence and cite the page.")
    parser.add_argument("--pages", type=int, default=14, help="pages of the book to keep (the 8K-token model)")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    from app.ui import build_ui, launch_options
    from benchmarks.corpus import fetch_corpus
    from engine import DocumentSession, OffloadPolicy
    from engine.models import describe
    from engine.models.loader import load_model

    pdf = Path(args.pdf) if args.pdf else _first_pages(
        fetch_corpus(ROOT / ".pytest_cache" / "d" / "debian-documents")["faq-pdf"], args.pages)
    model, tokenizer = load_model(None, device="cpu", dtype="float32")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    demo = build_ui(lambda: DocumentSession(model, tokenizer, OffloadPolicy()), model_info=describe(model))
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **launch_options())
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(600_000)
            page.goto(demo.local_url)
            page.locator("#file-drop input[type=file]").set_input_files(str(pdf))
            page.wait_for_selector("#plan .plan[data-tokens]")  # the real plan, not the empty one
            page.screenshot(path=str(SHOTS / "07-real-pdf-plan.png"))
            if page.get_attribute("#plan .plan", "data-fits") == "false":
                page.locator("#truncate input").check()
                page.wait_for_selector("#read:not([disabled])")
            started = time.monotonic()
            page.click("#read")
            page.wait_for_selector("#prefill-progress .progress[data-state=running]")
            page.wait_for_timeout(4000)
            page.screenshot(path=str(SHOTS / "08-real-pdf-reading.png"))
            page.wait_for_selector("#prefill-progress .progress[data-state=done]")
            print(f"read in {time.monotonic() - started:.0f} s")
            page.fill("#question textarea", args.question)
            page.click("#ask")
            page.wait_for_function("() => { const s = [...document.querySelectorAll('#chat .answer-stats')].pop();"
                                   " return s && !s.innerText.includes('writing'); }")
            page.wait_for_timeout(1500)
            if page.locator("#page-chips label").count():
                page.locator("#page-chips label").first.click()
                page.wait_for_selector("#page-view .page-view[data-page]")
            page.screenshot(path=str(SHOTS / "09-real-pdf-answer-sources.png"), full_page=True)
            print(page.locator("#chat .message.bot, #chat [data-testid=bot]").last.inner_text())
            browser.close()
    finally:
        demo.close()
    return 0


def _first_pages(pdf: Path, pages: int) -> Path:
    """The book's first pages as a PDF of their own (the real pages, cut with pypdf): the whole FAQ is about
    five times what the embedded model can read, and the app refuses such a file unread."""
    from pypdf import PdfReader, PdfWriter

    reader, writer = PdfReader(pdf), PdfWriter()
    for page in reader.pages[:pages]:
        writer.add_page(page)
    target = Path("/tmp") / f"{pdf.stem}-first-{pages}-pages.pdf"
    with open(target, "wb") as file:
        writer.write(file)
    return target


if __name__ == "__main__":
    raise SystemExit(main())
