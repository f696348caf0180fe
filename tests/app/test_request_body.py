"""Files inside a JSON body (``app.request_body``, through ``app.guard``): a ``FileData`` whose path is a URL, which
Gradio would download into the upload folder outside the upload budget and with no size limit, is refused before
the app runs; a body past 64 MiB too, said or streamed; an uploaded file's path and every other body reach the app
byte for byte."""

from __future__ import annotations

import json

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from app import request_body
from app.guard import RequestGuard
from app.hosts import AllowedHosts

JOIN = "/gradio_api/queue/join"


def _file(path: str) -> dict:
    return {"path": path, "url": None, "orig_name": "x.pdf", "meta": {"_type": "gradio.FileData"}}


def _join(*data) -> dict:
    return {"data": list(data), "fn_index": 3, "session_hash": "abc123", "event_data": None, "trigger_id": 7}


@pytest.fixture
def served():
    """A guard before a Starlette app that records each body it is handed."""
    bodies: list[bytes] = []

    async def take(request):
        bodies.append(await request.body())
        return PlainTextResponse("ok")

    routes = [Route(path, take, methods=["POST"]) for path in
              (JOIN, "/gradio_api/run/ask", "/gradio_api/upload", "/login", "/gradio_api/process_recording")]
    client = TestClient(RequestGuard(Starlette(routes=routes), AllowedHosts(frozenset({"testserver"}))))
    return client, bodies


@pytest.mark.parametrize("path", ["https://example.com/ten-gigabytes.pdf", "http://93.184.215.14/x.pdf",
                                  " HTTPS://example.com/x", "data:application/pdf;base64,JVBERi0=", "file:///etc/passwd"])
def test_a_file_named_by_url_in_a_body_is_refused_before_the_app_runs(served, path):
    client, bodies = served
    # Inside a list of files (gr.File with several), as the page sends them, and deeper in a chat message.
    for body in (_join([_file("/tmp/gradio/a/notes.txt"), _file(path)], None),
                 _join([{"role": "user", "content": [{"file": _file(path)}]}])):
        refused = client.post(JOIN, json=body)
        assert refused.status_code == 403 and "not by URL" in refused.text
        refused = client.post("/gradio_api/run/ask", content=json.dumps({"data": body["data"]}))  # no content type
        assert refused.status_code == 403
    assert bodies == []


def test_an_uploaded_files_path_and_every_other_body_reach_the_app_unchanged(served):
    client, bodies = served
    body = json.dumps(_join([_file("/tmp/gradio/a/notes.txt"), _file(r"C:\Users\me\gradio\b.pdf")],
                            "What does https://example.com say?", {"url": "http://127.0.0.1:7860/gradio_api/file=x"}))
    assert client.post(JOIN, content=body, headers={"Content-Type": "application/json"}).text == "ok"
    streamed = client.post(JOIN, content=iter([body[:10].encode(), body[10:].encode()]))  # chunked, no length
    assert streamed.text == "ok"
    assert bodies == [body.encode(), body.encode()]
    # Forms are not looked into: the login, an upload (the budget's).
    assert client.post("/login", data={"username": "a", "password": "https://x"}).text == "ok"
    upload = client.post("/gradio_api/upload", files={"files": ("x.json", json.dumps(_file("https://x/y")))})
    assert upload.text == "ok"


def test_a_body_past_the_limit_is_refused_said_or_streamed(served, monkeypatch):
    client, bodies = served
    monkeypatch.setattr(request_body, "BODY_LIMIT", 1000)
    said = client.post(JOIN, content=b"x" * 1001, headers={"Content-Type": "application/json"})
    assert said.status_code == 413 and "at most" in said.text
    streamed = client.post(JOIN, content=iter([b"[" * 600, b"]" * 600]))
    assert streamed.status_code == 413
    assert client.post(JOIN, content=b"[" * 500 + b"]" * 500).text == "ok"  # at the limit: taken
    assert bodies == [b"[" * 500 + b"]" * 500]


def test_a_deeply_nested_body_is_refused_and_gradios_recording_route_is_closed(served):
    client, bodies = served
    deep = client.post(JOIN, content=b"[" * 200_000 + b"]" * 200_000)
    assert deep.status_code == 400 and "nested" in deep.text
    assert client.post("/gradio_api/process_recording", files={"video": ("v.mp4", b"x")}).status_code == 403
    assert bodies == []
