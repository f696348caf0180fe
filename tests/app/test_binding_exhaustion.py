"""One visitor holding open requests cannot lock new tabs out at the session-hash binding (``app.session_binding``):
on a real port, with the binding's capacity made small, open heartbeats on made-up hashes up to and past it leave a
new browser tab served, and one request naming many hashes in its query is refused instead of holding them all."""

from __future__ import annotations

import contextlib
import time

import gradio as gr
import httpx
import pytest
from ports import free_port
from starlette.middleware import Middleware

from app.browser_id import COOKIE, BrowserIdCookie
from app.session_binding import SessionBinding, SessionBindings

CAPACITY = 6


@pytest.fixture(scope="module")
def served():
    """``(url, bindings)``: a page behind the studio's cookie and binding middlewares, the binding holding at most
    ``CAPACITY`` hashes."""
    bindings = SessionBindings(capacity=CAPACITY)
    with gr.Blocks() as demo:
        gr.Textbox("a page")
    middleware = [Middleware(BrowserIdCookie), Middleware(SessionBinding, bindings=bindings)]
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                app_kwargs={"middleware": middleware})
    yield demo.local_url.rstrip("/"), bindings
    demo.close()


def _heartbeat(stack: contextlib.ExitStack, client: httpx.Client, session_hash: str, **params) -> int:
    """Opens the tab's heartbeat (it stays open, as a tab's does) and gives its status."""
    return stack.enter_context(client.stream("GET", f"/gradio_api/heartbeat/{session_hash}", params=params)).status_code


def _tab(url: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=30)
    client.get("/")
    assert client.cookies.get(COOKIE)
    return client


def test_open_requests_past_the_capacity_leave_a_new_tab_served(served):
    url, bindings = served
    mallory = httpx.Client(base_url=url, timeout=30, limits=httpx.Limits(max_connections=4 * CAPACITY))
    with contextlib.ExitStack() as stack:
        for number in range(CAPACITY):  # every hash the binding holds is open
            assert _heartbeat(stack, mallory, f"flood{number:04d}") == 200
        alice = _tab(url)
        assert _heartbeat(stack, alice, "alicetab01") == 200  # before: 503, "Too many tabs are open"
        assert len(bindings) == CAPACITY + 1  # open hashes are held past the capacity, never refused
        assert _heartbeat(stack, _tab(url), "alicetab01") == 403  # still her tab alone
        assert _heartbeat(stack, alice, "flood0000") == 403
    # The flood closed: the next claim forgets idle hashes down to the capacity again.
    mallory.close()
    deadline = time.monotonic() + 20
    while any(held.open for held in bindings._held.values()) and time.monotonic() < deadline:
        time.sleep(0.05)  # the server ends each closed heartbeat as it sees the disconnect
    with httpx.Client(base_url=url, timeout=30) as other, contextlib.ExitStack() as stack:
        assert _heartbeat(stack, other, "anewtab01") == 200
        assert len(bindings) <= CAPACITY


def test_one_request_naming_many_hashes_is_refused(served):
    url, bindings = served
    many = [("session_hash", f"many{number:04d}") for number in range(3 * CAPACITY)]
    with httpx.Client(base_url=url, timeout=30) as mallory, contextlib.ExitStack() as stack:
        response = stack.enter_context(mallory.stream("GET", "/gradio_api/heartbeat/many0000", params=many))
        assert response.status_code == 400  # before: 503 past the capacity, and below it every hash held open
        assert not any(session_hash.startswith("many") for session_hash in bindings._held)
        assert _heartbeat(stack, _tab(url), "bobstab001") == 200
