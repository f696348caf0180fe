"""The page's named API endpoints, served in-process and driven through ``gradio_client``."""

from __future__ import annotations

import re
import time

import pytest
from gradio_client import Client, handle_file
from lighthouse import QUESTION
from ports import free_port

from app.questions import LONGEST_ANSWER
from app.ui import build_ui
from engine import DocumentSession, OffloadPolicy
from engine.models.loader import describe

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def app_url(embedded_model):
    model, tokenizer = embedded_model
    demo = build_ui(lambda: DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=32)),
                    model_info=describe(model))
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
    yield demo.local_url
    demo.close()


@pytest.fixture
def client(app_url):
    client = Client(app_url, verbose=False)  # one client = one browser session
    yield client
    client.close()


def _message_text(message: dict) -> str:
    content = message["content"]
    if isinstance(content, list):  # Gradio 6 sends content as typed parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def _read(client: Client, pdf: str) -> list:
    table, plan, truncate, status = client.predict([handle_file(pdf)], api_name="/upload")
    assert "lighthouse.pdf" in table and 'data-fits="true"' in plan and truncate["visible"] is False
    assert "Ready to read" in status
    job = client.submit(False, api_name="/read")
    job.result(timeout=120)
    return job.outputs()


def test_upload_plan_read_ask_new_chat(client, secret_pdf):
    outputs = _read(client, secret_pdf)
    progress = [out[0] for out in outputs]
    assert any('data-state="running"' in bar for bar in progress)
    assert 'data-state="done"' in progress[-1]

    job = client.submit(QUESTION, [], 24, 0.0, api_name="/ask")
    job.result(timeout=480)  # 163 s alone on a loaded 2-core VM (the first answer finds the retrieval heads)
    chats = [out[0] for out in job.outputs()]
    answers = {_message_text(chat[-1]) for chat in chats if chat and chat[-1]["role"] == "assistant"}
    assert len(answers) > 2  # streamed
    final = _message_text(chats[-1][-1])
    assert re.search(r"TTFT \d+\.\d\d s · \d+ tokens · \d+\.\d tok/s", final)
    assert "Sources: p. 3" in re.sub(r"<[^>]+>", "", final)  # the page holding the answer, read from the attention
    assert '<span title="PDF page 3">p. 3' in final  # the PDF page as the tooltip
    chips = job.outputs()[-1][3]
    assert chips["visible"] and chips["choices"][0] == ["p. 3", "3"] and chips["value"] is None
    page_html = client.predict("3", api_name="/page")
    assert "page 3" in page_html and "AMBER-7" in page_html  # the page viewer shows that page's text

    chat, status = client.predict(api_name="/new_chat")
    assert chat == [] and "documents stay read" in status
    job = client.submit("Who keeps the lighthouse?", [], 8, 0.0, api_name="/ask")
    chat, _, status, _ = job.result(timeout=120)
    assert len(chat) == 2 and "tok/s" in status  # a fresh conversation, answered from the same KV


def test_stop_interrupts_a_running_answer(client, secret_pdf):
    _read(client, secret_pdf)
    job = client.submit(QUESTION, [], 400, 0.0, api_name="/ask")
    deadline = time.monotonic() + 120
    while not any("tokens" in _message_text(out[0][-1]) for out in job.outputs() if out[0]):
        assert time.monotonic() < deadline, "no streamed token arrived"
        time.sleep(0.1)
    client.predict(api_name="/stop")  # a light event: runs while the answer holds the compute slot
    chat, _, status, _ = job.result(timeout=120)
    assert "stopped" in _message_text(chat[-1]) and "stopped" in status


def test_each_browser_session_has_its_own_document(app_url, client, secret_pdf):
    _read(client, secret_pdf)
    other = Client(app_url, verbose=False)
    try:
        chat, _, status, _ = other.predict(QUESTION, [], 8, 0.0, api_name="/ask")
        assert chat == [] and "Read documents first" in status
    finally:
        other.close()


def test_clear_frees_the_document(client, secret_pdf):
    _read(client, secret_pdf)
    files, table, plan, truncate, progress, chat, status, chips, page = client.predict(api_name="/clear")
    assert not files and chat == [] and "memory is freed" in status
    assert chips.get("value") is None and not chips.get("choices") and chips.get("visible") is False  # chips hidden
    assert "Click a page chip" in page  # the old document's chips and viewer go with it
    _, _, status, _ = client.predict(QUESTION, [], 8, 0.0, api_name="/ask")
    assert "Read documents first" in status


def test_visitors_take_turns_on_the_compute_device(app_url, client, secret_pdf, tmp_path):
    from gradio_client.utils import Status
    from make_files import make_pdf

    long_pdf = str(make_pdf(tmp_path / "long.pdf", ["The keeper trimmed the wick and wrote the weather. " * 40] * 2))
    other = Client(app_url, verbose=False)
    try:
        client.predict([handle_file(long_pdf)], api_name="/upload")
        other.predict([handle_file(secret_pdf)], api_name="/upload")
        first = client.submit(False, api_name="/read")
        while first.status().code not in (Status.PROCESSING, Status.ITERATING):
            time.sleep(0.05)
        second = other.submit(False, api_name="/read")
        while not second.done():
            time.sleep(0.05)
        # The second read waited while the first held the compute device, and was told its place and wait.
        waiting = [out[1] for out in second.outputs() if 'data-queue-position="1"' in str(out[1])]
        assert waiting and "1st in line, about" in waiting[0]
        first.result(timeout=120)
        assert 'data-state="done"' in second.outputs()[-1][0]
    finally:
        other.close()


def test_the_longest_answer_slider_offers_what_the_conversation_allowance_plans_for(embedded_model):
    """The slider's maximum is the engine's longest planned answer, and a question asking for it is not refused
    for the answer's length (a slider wider than the allowance would offer answers the plan refuses)."""
    model, tokenizer = embedded_model
    demo = build_ui(lambda: DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=32)), model_info=describe(model))
    sliders = [c["props"] for c in demo.config["components"]
               if c.get("props", {}).get("label") == "Longest answer (tokens)"]
    assert [s["maximum"] for s in sliders] == [LONGEST_ANSWER]
    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=32))
    assert session.answer_budget >= LONGEST_ANSWER
