"""The OpenAI endpoint against a hostile client (no model needed): bodies past the limit however they are sent,
JSON nested past the parser's depth under a content type the guard does not screen, seeds and stop sequences that
cost the device its turn. Each case was a 500, a body read whole, or minutes of CPU before its fix."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import httpx
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from app.openai_api import routes as api_routes
from app.openai_api.routes import MAX_IN_FLIGHT, OpenAIRoutes
from app.openai_api.schema import MAX_STOP_CHARS, ApiError, chat_request, usage

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


class _HeldLine:
    """Stands in for the compute (``Completions``): every answer waits until ``release`` is set, as in a busy line."""

    def __init__(self):
        self.release, self.started = threading.Event(), 0

    def check(self, request):
        return request

    def run(self, checked, report, gone):
        self.started += 1
        while not self.release.wait(0.05) and not gone():
            pass
        report(("end", "stop", usage(1, 0), {}))


def test_past_max_in_flight_api_requests_a_429_until_one_finishes():
    # Before: 60 parallel streams made 60 worker threads and 60 places in the page's line ahead of its visitors.
    routes = OpenAIRoutes(SimpleNamespace(app=None), lambda: "m", KEY)
    routes.completions = line = _HeldLine()
    app = Starlette(routes=routes.routes())
    body = {"model": "m", "prompt": "hi", "max_tokens": 1}

    async def crowd():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1",
                                     headers=AUTH, timeout=30) as client:
            first = [asyncio.create_task(client.post("/v1/completions", json=body)) for _ in range(MAX_IN_FLIGHT)]
            while line.started < MAX_IN_FLIGHT:
                await asyncio.sleep(0.02)
            try:  # before: this one waited in line too (here: until the timeout)
                extra = await asyncio.wait_for(client.post("/v1/completions", json=body), 10)
            finally:
                line.release.set()
            answers = await asyncio.gather(*first)
            after = await client.post("/v1/completions", json=body)
            return extra, answers, after

    extra, answers, after = asyncio.run(crowd())
    assert extra.status_code == 429 and extra.headers["retry-after"] and \
        extra.json()["error"]["code"] == "too_many_requests"
    assert [a.status_code for a in answers] == [200] * MAX_IN_FLIGHT
    assert after.status_code == 200 and routes.in_flight == 0  # every place given back
