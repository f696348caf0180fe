"""A real Chromium uses the studio under its Content-Security-Policy with no violation: the page's own inline
scripts and the upload check run, a document is read and asked about. Then the ``--share`` page: Gradio's
``share.html``, its front end from Gradio's CDN (served here from the installed package by the browser's router,
offline), opened by a share link's name (mapped to loopback by the browser), works the same, and a script from
elsewhere is still refused."""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from chromium import CHROMIUM, CHROMIUM_ARGS
from make_files import make_pdf
from studio import read_and_ask

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SHARE_HOST = "k3x9q2.gradio.live"
MAX_UPLOAD = 64 * 1024
# Every violation and every console error, kept in the page (the listener is there before the page's scripts).
RECORD = """window.__csp = []; window.__errors = [];
document.addEventListener('securitypolicyviolation', e => window.__csp.push(
  `${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`));"""


@pytest.fixture(scope="module")
def studio():
    """``(demo, port)``: the studio on loopback, answering to the share name too, as ``launch.py --share``."""
    from app.hosts import AllowedHosts
    from app.ui import build_ui, launch_options
    from engine import DocumentSession, OffloadPolicy
    from engine.models.loader import describe, load_model
    from engine.types import AnswerChunk

    class QuickAnswer(DocumentSession):
        """Reads for real; answers at once (the page's streaming path, without waiting on the model)."""

        def ask(self, question, **kwargs):
            yield AnswerChunk("The code is ", "The code is ", 4, 0.1, 10.0, done=False)
            yield AnswerChunk("The code is **AMBER-7**.", "**AMBER-7**.", 9, 0.1, 10.0, done=True)

    model, tokenizer = load_model(None)
    demo = build_ui(lambda: QuickAnswer(model, tokenizer, OffloadPolicy(chunk_size=256)), model_info=describe(model))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                max_file_size=MAX_UPLOAD, **launch_options(MAX_UPLOAD, hosts=AllowedHosts.for_launch("127.0.0.1", share=True)))
    try:
        yield demo, port
    finally:
        demo.close()


@pytest.fixture(scope="module")
def chromium():
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium is not installed (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=[
            *CHROMIUM_ARGS, f"--host-resolver-rules=MAP {SHARE_HOST} 127.0.0.1"])
        yield browser
        browser.close()


def use_the_page(browser, url: str, tmp_path, *, cdn: str | None = None) -> dict:
    """Opens ``url``, tries a file over the limit, reads a PDF, asks; returns what the page recorded."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    from_cdn = _serve_cdn_offline(context, cdn) if cdn is not None else []
    page = context.new_page()
    page.set_default_timeout(300_000)  # a loaded 2-core machine
    page.add_init_script(RECORD)
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url)
    big = tmp_path / "big.txt"
    big.write_text("x" * (MAX_UPLOAD + 1), encoding="utf-8")
    page.locator("#file-drop input[type=file]").set_input_files(str(big))  # the upload check (an inline script)
    page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('this app accepts')")
    pdf = make_pdf(tmp_path / "lighthouse.pdf", ["The keeper is Mara.", "The secret code is AMBER-7."])
    read_and_ask(page, pdf, "What is the code?")
    page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('tok/s')")
    # (the status can name the read's tok/s while the answer's bubble still streams: wait for the answer's words)
    page.wait_for_function("() => [...document.querySelectorAll('#chat .message.bot, #chat [data-testid=bot]')]"
                           ".pop()?.innerText.includes('AMBER-7')", timeout=120_000)
    answer = page.locator("#chat .message.bot, #chat [data-testid=bot]").last.inner_text()
    # A script from elsewhere is refused (and reported) on this page too.
    page.evaluate("""() => { const s = document.createElement('script');
        s.src = 'https://evil.example/x.js'; document.head.appendChild(s); }""")
    page.wait_for_function("() => window.__csp.length > 0", timeout=10_000)
    seen = {"answer": answer, "violations": page.evaluate("() => window.__csp"), "errors": errors,
            "from_cdn": from_cdn}
    context.close()
    return seen


def _serve_cdn_offline(context, cdn: str) -> list[str]:
    """Answers the page's requests to Gradio's CDN folder from the installed front end; returns their list."""
    import gradio

    front_end = Path(gradio.__file__).resolve().parent / "templates" / "frontend"
    parts = urlsplit(cdn)
    host, folder = f"{parts.scheme}://{parts.netloc}", parts.path
    served: list[str] = []

    def fulfil(route) -> None:
        served.append(route.request.url)
        path = route.request.url.split("?")[0][len(host):]  # /<version>/..., or /assets/... (the stylesheet)
        file = front_end / (path[len(folder):] if path.startswith(folder) else path.lstrip("/"))
        if not file.is_file():
            route.fulfill(status=404)
            return
        kind = "text/javascript" if file.suffix in (".js", ".mjs") else None
        route.fulfill(path=str(file), headers={"access-control-allow-origin": "*", **({"content-type": kind} if kind else {})})

    context.route(host + "/**", fulfil)
    return served


def only_the_planted_script(seen: dict) -> None:
    assert "AMBER-7" in seen["answer"]
    assert seen["violations"] == [v for v in seen["violations"] if "evil.example/x.js" in v]
    assert len(seen["violations"]) == 1, seen["violations"]
    blocked = [e for e in seen["errors"] if ("Content Security Policy" in e or "EvalError" in e)
               and "evil.example" not in e]
    assert not blocked, blocked


def test_the_page_works_under_its_policy_with_no_violation(studio, chromium, tmp_path):
    _, port = studio
    only_the_planted_script(use_the_page(chromium, f"http://127.0.0.1:{port}/", tmp_path))


def test_the_share_page_works_under_its_policy_through_the_share_name(studio, chromium, tmp_path):
    from app.csp import share_front_end

    demo, port = studio
    demo.share = True  # Gradio then serves share.html, as behind a share link
    try:
        seen = use_the_page(chromium, f"http://{SHARE_HOST}:{port}/", tmp_path, cdn=share_front_end())
    finally:
        demo.share = False
    assert any(url.endswith("/gradio.js") for url in seen["from_cdn"]), seen["from_cdn"]
    only_the_planted_script(seen)
