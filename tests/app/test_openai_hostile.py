"""The OpenAI endpoint against a hostile client (no model needed): bodies past the limit however they are sent,
JSON nested past the parser's depth under a content type the guard does not screen, seeds and stop sequences that
cost the device its turn. Each case was a 500, a body read whole, or minutes of CPU before its fix."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from app.openai_api import routes as api_routes
from app.openai_api.routes import OpenAIRoutes
from app.openai_api.schema import MAX_STOP_CHARS, ApiError, chat_request

KEY = "hostile-test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def client(monkeypatch):
    """The routes on a bare Starlette app; the library is never reached: every request here is refused first."""
    monkeypatch.setattr(api_routes, "MAX_BODY", 1 << 20)  # 1 MiB: the same check as 64 MiB, in less memory
    routes = OpenAIRoutes(SimpleNamespace(app=None), lambda: "m", KEY)
    return TestClient(Starlette(routes=routes.routes()))


def _chunked(total: int, piece: int = 64 << 10):
    """A body sent without a Content-Length (chunked), ``total`` bytes of a prompt."""
    yield b'{"model": "m", "prompt": "'
    for _ in range(total // piece):
        yield b"a" * piece
    yield b'"}'


@pytest.mark.parametrize("kind", ["text/plain", "application/json"])
def test_a_chunked_body_past_the_limit_is_a_413(client, kind):
    # Before: only Content-Length was checked; a chunked body was read whole and handed on (on the real app a
    # 100 MiB text/plain one was parsed and answered 404 for its model).
    answer = client.post("/v1/completions", content=_chunked(2 << 20), headers={**AUTH, "Content-Type": kind})
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "body_too_large"


def test_a_said_length_past_the_limit_is_a_413_before_reading(client):
    answer = client.post("/v1/completions", content=b"x" * ((1 << 20) + 1), headers=AUTH)
    assert answer.status_code == 413


def test_json_nested_past_the_parsers_depth_as_text_plain_is_a_400(client):
    nested = b"[" * 200_000 + b"]" * 200_000  # app.request_body screens JSON content types only
    answer = client.post("/v1/chat/completions", content=nested, headers={**AUTH, "Content-Type": "text/plain"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_json"  # before: 500


def test_no_key_no_body_read(client):
    answer = client.post("/v1/completions", content=_chunked(2 << 20))
    assert answer.status_code == 401


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 10**30])
def test_a_seed_torch_cannot_take_is_a_400(seed):
    # Before: accepted, then a 500 'Overflow when unpacking long long' once its turn in the line came.
    with pytest.raises(ApiError) as refused:
        chat_request({"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": seed})
    assert refused.value.status == 400 and refused.value.param == "seed"


def test_the_seeds_torch_takes_are_read():
    for seed in (-(2**63), 0, 2**64 - 1):
        assert chat_request({"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": seed}).seed == seed


def test_a_stop_sequence_past_its_length_is_a_400():
    # Before: four 200,000-character stops were taken; the stream's hold-back check costs a stop's length squared
    # at every token (300 tokens: 1.4 s of CPU, growing with the cube of the answer's length).
    long = "x" * (MAX_STOP_CHARS + 1)
    with pytest.raises(ApiError) as refused:
        chat_request({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": [long]})
    assert refused.value.param == "stop"
    ok = chat_request({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": ["x" * MAX_STOP_CHARS]})
    assert ok.stop == ("x" * MAX_STOP_CHARS,)
