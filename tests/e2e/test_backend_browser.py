"""``launch.py --backend URL`` in a real Chromium, against a real OpenAI-compatible server running here
(``transformers serve`` on the embedded SmolLM2, offline): drop a PDF, choose its pages, read it on the backend, ask,
watch the answer stream with its TTFT and tok/s, and see what needs our engine labelled unavailable."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from backend_server import transformers_serve
from lighthouse import PAGES, QUESTION
from make_files import make_pdf
from ports import free_port
from studio import tab

from engine.models.loader import embedded_model_dir

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_MS = 240_000  # the backend writes about a token a second on this shared CPU


@pytest.fixture(scope="module")
def backend_app(tmp_path_factory):
    """The URL of ``launch.py --backend`` (its key from ``HEADINFER_BACKEND_KEY``) over ``transformers serve``."""
    with transformers_serve(embedded_model_dir()) as (backend, _model):
        port = free_port()
        log = tmp_path_factory.mktemp("backend") / "launch.log"
        env = {**os.environ, "HEADINFER_BACKEND_KEY": "sk-not-checked-by-transformers-serve"}
        with open(log, "wb") as out:
            app = subprocess.Popen([sys.executable, str(ROOT / "launch.py"), "--backend", backend, "--port", str(port)],
                                   cwd=ROOT, env=env, stdout=out, stderr=out)
        url = f"http://127.0.0.1:{port}/"
        try:
            deadline = time.monotonic() + 180
            while True:
                assert app.poll() is None, log.read_text()
                try:
                    if httpx.get(url, timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(1)
            yield url, backend, log
        finally:
            app.terminate()
            app.wait(timeout=20)


def test_read_and_ask_through_the_backend(backend_app, browser, tmp_path):
    url, backend, log = backend_app
    page = tab(browser, url, TIMEOUT_MS)
    assert page.locator("#backend-header").get_attribute("data-backend") == backend
    # Each thing our engine alone gives is labelled unavailable, not shown empty.
    labels = page.locator("#backend-unavailable li[data-unavailable]")
    labels.first.wait_for()  # rendered after the page's load event
    assert sorted(labels.evaluate_all("els => els.map(e => e.dataset.unavailable)")) == [
        "plan", "reopen", "sources", "support"]
    for text in labels.all_inner_texts():
        assert "unavailable with this backend" in text

    pdf = make_pdf(tmp_path / "lighthouse.pdf", PAGES)
    page.locator("#file-drop input[type=file]").set_input_files(str(pdf))
    page.wait_for_selector("#range-from", state="visible")  # three pages: a range is offered
    page.click("#range-from input")
    page.get_by_role("option", name="p. 3").click()  # the page with the code, alone
    page.click("#read")
    page.wait_for_selector("#prefill-progress .progress[data-state=done]")
    tokens = int(page.locator("#prefill-progress .progress").get_attribute("data-total"))
    assert 0 < tokens < 200  # page 3 alone with its header, counted by the backend's tokenizer

    page.click("text=Answer settings")
    page.fill("#max-tokens input[type=number]", "16")  # the slider's step is 8: a value on it
    page.press("#max-tokens input[type=number]", "Enter")
    # The ask sends the slider's value: wait until the slider holds it (on a loaded machine the Enter lands late and
    # the answer ran to the default 512, the model ending at 20 tokens).
    page.wait_for_function("document.querySelector('#max-tokens input[type=range]').value === '16'")
    page.fill("#question textarea", QUESTION)
    page.click("#ask")
    page.wait_for_selector("#status .status[data-kind=info]:has-text('Writing the answer')")  # streaming
    streamed = page.locator("#chat .message.bot, #chat [data-testid=bot]").last.inner_text()
    done = page.wait_for_selector("#status .status[data-kind=ok]:has-text('tok/s')")
    stats = done.inner_text()
    assert "TTFT" in stats and "16 tokens" in stats
    answer = page.locator("#chat .message.bot, #chat [data-testid=bot]").last.inner_text()
    # The final text goes on from what was streamed (the stats lines below each differ: "· writing…" while it streams).
    assert answer.split("\n\nTTFT")[0].startswith(streamed.split("\n\nTTFT")[0].rstrip("…")) and "tok/s" in answer
    assert page.locator("#chat .answer-sources").count() == 0  # no sources made up
    assert "answering through" in log.read_text()
