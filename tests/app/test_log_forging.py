"""A visitor cannot write lines of their own into the app's log: the request paths the guard, the session-hash
binding and the API's key gate log when they refuse are written escaped (a percent-encoded line break in a path is
a real one once the server decodes it; before, ``/v1/models%0A... INFO owner ...`` logged a forged second line)."""

from __future__ import annotations

import logging

import httpx
import pytest
from ports import free_port

from app.openai_api.mount import with_api
from app.ui import build_ui, launch_options

KEY = "forging-test-key-0123456789abcdef"
FORGED = "%0D%0A2026-12-02 09:00:00,000 INFO headinfer.owner: the owner link was opened"


@pytest.fixture(scope="module")
def url():
    demo = build_ui(lambda: None, model_info={"name_or_path": "a model"})
    options = with_api(launch_options(), demo, private=True, key=KEY, model_name=lambda: "a model")
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True, **options)
    yield demo.local_url.rstrip("/")
    demo.close()


@pytest.mark.parametrize(("path", "headers", "status"), [
    (f"/v1/models{FORGED}", {}, 401),  # the API's key gate
    (f"/gradio_api/heartbeat/tab{FORGED}?session_hash=a&session_hash=b", {}, 400),  # the session-hash binding
    (f"/config{FORGED}", {"Host": "rebound.example"}, 421),  # the guard's Host check
])
def test_a_refused_paths_line_break_is_logged_escaped(url, caplog, path, headers, status):
    with caplog.at_level(logging.INFO), httpx.Client(base_url=url, timeout=30) as client:
        assert client.get(path, headers=headers).status_code == status
    refusals = [record.getMessage() for record in caplog.records if record.getMessage().startswith("refused")]
    assert refusals
    assert not [line for line in refusals if "\n" in line or "\r" in line]
    assert any("owner link was opened" in line for line in refusals)  # logged, as one line
