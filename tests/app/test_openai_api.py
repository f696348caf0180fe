"""The OpenAI-compatible endpoint (``launch.py --api``) on the real app, driven by the official ``openai`` client:
chat whole and streamed, stop sequences, usage, the errors, the key, and exact KV reuse of a document a page tab
read (its greedy answer equals the page's own)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest
from gradio_client import Client, handle_file
from lighthouse import QUESTION
from ports import free_port

from app.openai_api.mount import with_api
from app.openai_api.naming import public_id
from app.ui import build_ui, launch_options
from engine import DocumentSession, OffloadPolicy
from engine.models.loader import describe

pytestmark = pytest.mark.slow

KEY = "test-key-0123456789abcdef"


@pytest.fixture(scope="module")
def served(embedded_model):
    """``(url, demo, model id)``: the page with ``--api`` and a key, on loopback."""
    model, tokenizer = embedded_model
    demo = build_ui(lambda: DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=32)),
                    model_info=describe(model))
    name = describe(model).get("name_or_path") or "headinfer"
    options = with_api(launch_options(), demo, private=False, key=KEY, model_name=lambda: name)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True, **options)
    yield demo.local_url.rstrip("/"), demo, name
    demo.close()


@pytest.fixture(scope="module")
def client(served):
    url, _, _ = served
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, timeout=600, max_retries=0)  # the first answer calibrates the sources


def _chat(client, served, content: str, **kwargs):
    return client.chat.completions.create(model=served[2], messages=[{"role": "user", "content": content}],
                                          temperature=0, **kwargs)


def test_models_lists_the_served_model(client, served):
    # Its id (the embedded model's folder name), never the path it was loaded from.
    assert [m.id for m in client.models.list().data] == [public_id(served[2])] != [served[2]]


def test_chat_whole_and_streamed_give_the_same_greedy_answer_with_usage(client, served):
    whole = _chat(client, served, "Name three colours.", max_tokens=12)
    assert whole.choices[0].message.content and whole.choices[0].finish_reason in ("stop", "length")
    usage = whole.usage
    assert usage.prompt_tokens > 5 and 1 <= usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    stream = _chat(client, served, "Name three colours.", max_tokens=12, stream=True,
                   stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content  # the same prompt, greedy: the same tokens
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 2  # streamed, not one piece
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == usage.completion_tokens
    # The second time the prompt is the API session's document already read: all but its last token reused.
    extra = whole.model_extra["headinfer"]
    assert extra["reused_tokens"] == 0
    again = _chat(client, served, "Name three colours.", max_tokens=12)
    assert again.model_extra["headinfer"]["reused_tokens"] == usage.prompt_tokens - 1


def test_stop_sequence_ends_the_answer_before_it(client, served):
    free = _chat(client, served, "Count from 1 to 10, separated by commas.", max_tokens=30)
    text = free.choices[0].message.content
    assert "3" in text, text
    stop = text[text.index("3"):text.index("3") + 1]
    stopped = _chat(client, served, "Count from 1 to 10, separated by commas.", max_tokens=30, stop=[stop])
    assert stopped.choices[0].message.content == text[:text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"
    streamed = _chat(client, served, "Count from 1 to 10, separated by commas.", max_tokens=30, stop=stop,
                     stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text[:text.index(stop)]


def test_completions_endpoint(client, served):
    out = client.completions.create(model=served[2], prompt="The capital of France is", max_tokens=5, temperature=0)
    assert out.choices[0].text and out.usage.completion_tokens <= 5 and out.object == "text_completion"


def test_errors_in_openai_shape(client, served):
    url, _, name = served
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    assert unknown.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as long:
        _chat(client, served, "word " * 9000, max_tokens=10)
    assert long.value.body["code"] == "context_length_exceeded" and "tokens" in long.value.body["message"]
    with pytest.raises(openai.BadRequestError) as wrong_type:
        client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"temperature": "hot"})
    assert wrong_type.value.body["param"] == "temperature"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong-key-0123456789", max_retries=0).models.list()
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    bad = httpx.post(f"{url}/v1/chat/completions", content=b"{not json", headers=headers)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    missing = httpx.get(f"{url}/v1/models")
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "invalid_request_error"
    # The page's guard covers the API: another site's page cannot call it from a browser, and no CORS is echoed.
    foreign = httpx.get(f"{url}/v1/models", headers={**headers, "Origin": "https://evil.example"})
    assert foreign.status_code == 403 and "access-control-allow-origin" not in foreign.headers
    rebound = httpx.get(f"{url}/v1/models", headers={**headers, "Host": "evil.example"})
    assert rebound.status_code == 421
    assert _chat(client, served, "Say hi.", max_tokens=2).usage.completion_tokens >= 1  # the app stays up


def _read_in_a_tab(url: str, pdf: str) -> Client:
    tab = Client(url, verbose=False)
    tab.predict([handle_file(pdf)], api_name="/upload")
    tab.submit(False, api_name="/read").result(timeout=300)
    return tab


def test_a_follow_up_over_a_tab_document_reuses_its_kv_and_answers_as_the_page(client, served, secret_pdf):
    url, demo, name = served
    tab = _read_in_a_tab(url, secret_pdf)
    try:
        state = next(s for s in demo.studio_state.tabs.values() if s.session is not None and s.session.is_prefilled)
        session = state.session
        job = tab.submit(QUESTION, [], 16, 0.0, False, False, api_name="/ask")  # greedy, no repeat guard
        job.result(timeout=300)
        page_answer = session.conversation()[-1][1]
        documents = httpx.get(f"{url}/v1/documents", headers={"Authorization": f"Bearer {KEY}"}).json()["data"]
        listed = next(d for d in documents if d["kind"] == "tab")
        assert listed["tokens"] == session.document_tokens and listed["messages"]
        messages = [dict(m) for m in listed["messages"]]
        messages[-1]["content"] += QUESTION
        out = client.chat.completions.create(model=name, messages=messages, max_tokens=16, temperature=0)
        extra = out.model_extra["headinfer"]
        assert extra["document"]["kind"] == "tab"
        assert extra["reused_tokens"] >= session.document_tokens  # the document was not read again
        assert out.choices[0].message.content == page_answer  # the page's own greedy tokens
        assert session.conversation()[-1][1] == page_answer  # the tab's conversation is untouched
    finally:
        tab.close()


def test_a_streaming_client_that_disconnects_frees_the_line(client, served):
    url, demo, name = served
    queue = demo.studio_state.queue
    # Counting runs to its 1,500-token limit (a minute or more here) unless the client's leaving stops it.
    body = {"model": name, "prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 1500, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body,
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
                break  # the answer is running: leave mid-stream
    # Its place goes: a job joining now gets the device within a token's time or so, not after 1,500 tokens.
    probe = queue.join("probe", 0.0)
    try:
        deadline = time.monotonic() + 10
        while queue.position(probe) != 0:
            assert time.monotonic() < deadline, "the abandoned answer still holds the compute device"
            time.sleep(0.05)
    finally:
        queue.leave(probe)
    assert _chat(client, served, "Say hi.", max_tokens=2).usage.completion_tokens >= 1


def _serve(embedded_model, store) -> tuple[str, object, str]:
    model, tokenizer = embedded_model
    demo = build_ui(lambda: DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=32)),
                    model_info=describe(model), snapshot_store=store)
    name = describe(model).get("name_or_path") or "headinfer"
    options = with_api(launch_options(), demo, private=False, key=None, model_name=lambda: name)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True, **options)
    return demo.local_url.rstrip("/"), demo, name


def test_a_document_on_the_shelf_answers_from_its_saved_kv_after_a_restart(embedded_model, secret_pdf, tmp_path):
    from engine import SnapshotStore

    url, first, _ = _serve(embedded_model, SnapshotStore(tmp_path / "kv"))
    try:
        _read_in_a_tab(url, secret_pdf).close()  # read and saved on the shelf (remember is on by default)
    finally:
        first.close()
    url, again, name = _serve(embedded_model, SnapshotStore(tmp_path / "kv"))  # a fresh app on the same shelf
    try:
        listed = httpx.get(f"{url}/v1/documents").json()["data"]
        shelf = next(d for d in listed if d["kind"] == "shelf")
        messages = [dict(m) for m in shelf["messages"]]
        messages[-1]["content"] += QUESTION
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=600, max_retries=0)
        out = api.chat.completions.create(model=name, messages=messages, max_tokens=8, temperature=0)
        extra = out.model_extra["headinfer"]
        assert extra["document"]["kind"] == "shelf" and extra["reused_tokens"] == shelf["tokens"]  # restored, not read
        assert extra["computed_prompt_tokens"] == out.usage.prompt_tokens - shelf["tokens"]
        messages += [{"role": "assistant", "content": out.choices[0].message.content},
                     {"role": "user", "content": "Who keeps it?"}]
        follow_up = api.chat.completions.create(model=name, messages=messages, max_tokens=8, temperature=0)
        extra = follow_up.model_extra["headinfer"]
        assert extra["document"]["kind"] == "api" and extra["reused_tokens"] >= shelf["tokens"]
    finally:
        again.close()


def test_the_page_waits_behind_an_api_request_and_says_so(served, secret_pdf):
    url, _, name = served
    tab = _read_in_a_tab(url, secret_pdf)
    # Counting goes on to its token limit (a story may end early): the answer holds the device for minutes.
    body = {"model": name, "prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 1500, "temperature": 0, "stream": True}
    answering, leave = threading.Event(), threading.Event()

    def listen() -> None:  # reads the stream on (a client that stops reading has left: its answer would stop)
        with httpx.stream("POST", f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                          timeout=300) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
                    answering.set()
                if leave.is_set():
                    return

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    try:
        assert answering.wait(120), "the API's answer did not start"
        job = tab.submit(QUESTION, [], 8, 0.0, False, False, api_name="/ask")
        deadline = time.monotonic() + 120
        while not any("answering an API request" in str(out[2]) for out in job.outputs()):
            assert time.monotonic() < deadline, [str(out[2])[-300:] for out in job.outputs()]
            time.sleep(0.1)
        leave.set()  # the API client leaves: the page's question gets its turn and is answered
        chat, _, status, _ = job.result(timeout=300)
        assert "tok/s" in str(status) and chat[-1]["role"] == "assistant"
    finally:
        leave.set()
        listener.join(60)
        tab.close()
