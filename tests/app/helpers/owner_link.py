"""The owner link's test setting: a page behind its middleware, the cookie it gives the owner's browser, and a
``gr.Request`` as Gradio hands one to a handler (with that cookie or none), for the owner-gated handlers' tests."""

from __future__ import annotations

import gradio as gr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from app.owner import COOKIE, OwnerGate, owner_middleware


def owner_app(gate: OwnerGate) -> Starlette:
    """A page behind the owner link's middleware, as ``launch_options`` wires it into Gradio's app."""
    async def page(request):
        return PlainTextResponse("the page")

    return Starlette(routes=[Route("/", page)], middleware=owner_middleware(gate))


def gradio_request(cookie: str | None = None) -> gr.Request:
    """A ``gr.Request`` as Gradio makes one for a handler: around the starlette ``Request`` of the HTTP call."""
    headers = [(b"cookie", cookie.encode())] if cookie is not None else []
    scope = {"type": "http", "method": "POST", "path": "/gradio_api/queue/join", "headers": headers,
             "query_string": b"", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 7860), "scheme": "http"}
    return gr.Request(request=Request(scope), session_hash="tab-1")


def owner_cookie(gate: OwnerGate) -> str:
    """The cookie the owner link sets, taken from the middleware's own response."""
    with TestClient(owner_app(gate), follow_redirects=False) as client:
        response = client.get(f"/?owner={gate.key}")
    value = response.cookies[COOKIE]
    return f"{COOKIE}={value}"
