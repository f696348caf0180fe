"""The API's key before its body, and its model id, on the real server (Gradio's, with the page's guard and
``with_api`` as launch wires them; no model loads: neither check reaches one).

Before: ``GET /v1/models`` listed the served model's path on this machine, and a request without the key had its
body read by the page's guard (up to 64 MiB) before the route said 401."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from ports import free_port

from app.openai_api.mount import with_api
from app.openai_api.naming import public_id
from app.ui import build_ui, launch_options

KEY = "gate-test-key-0123456789abcdef"
SERVED = "/home/alice/private-models/SmolLM2-135M-Instruct"  # a launch's --model folder


@pytest.fixture(scope="module")
def url():
    demo = build_ui(lambda: None, model_info={"name_or_path": SERVED})
    options = with_api(launch_options(), demo, private=True, key=KEY, model_name=lambda: SERVED)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True, **options)
    yield demo.local_url.rstrip("/")
    demo.close()


def _answer_to_headers(url: str, headers: str, wait: float) -> bytes:
    """What the server says within ``wait`` seconds to a POST whose headers promise 50 MB that never come."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as sock:
        sock.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                      f"Content-Length: 50000000\r\n{headers}\r\n").encode())
        answer = b""
        try:
            while piece := sock.recv(4096):  # the answer's head and body, until the server closes
                answer += piece
        except TimeoutError:
            pass
        return answer


def test_no_key_is_a_401_before_a_byte_of_the_body(url):
    # Before: the guard waited for the 50 MB (nothing came back in 10 s); now the 401 comes at once.
    started = time.monotonic()
    answer = _answer_to_headers(url, "", wait=10.0)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b"invalid_api_key" in answer and time.monotonic() - started < 5.0
    wrong = _answer_to_headers(url, "Authorization: Bearer not-the-key-0123456789\r\n", wait=10.0)
    assert wrong.startswith(b"HTTP/1.1 401"), wrong[:200]


def test_with_the_key_the_body_is_read_and_counted(url):
    # The key's holder is let through to the guard and the route, which count the body as it arrives.
    answer = httpx.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                        json={"model": "SmolLM2-135M-Instruct", "messages": "not a list"}, timeout=30)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "messages"
    assert httpx.get(f"{url}/v1/models", timeout=30).status_code == 401


def test_models_shows_an_id_never_a_path(url):
    listed = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).json()
    assert [model["id"] for model in listed["data"]] == ["SmolLM2-135M-Instruct"]
    assert "/home" not in str(listed) and "alice" not in str(listed)
    unknown = httpx.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=30,
                         json={"model": "other", "messages": [{"role": "user", "content": "hi"}]})
    assert unknown.status_code == 404 and "alice" not in unknown.text  # the 404 names the id too


@pytest.mark.parametrize(("served", "shown"), [
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),  # a catalogue / Hub id
    ("/home/alice/models/Qwen3.5-4B/", "Qwen3.5-4B"),
    ("~/models/gemma-4", "gemma-4"),
    (r"C:\Users\alice\models\qwen", "qwen"),
    ("models/local/x", "x"),
    ("", "headinfer"),
])
def test_public_id(served, shown):
    assert public_id(served) == shown
