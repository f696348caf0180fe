"""ASGI middleware that serves only requests meant for this app, from its own page (``app.hosts`` says which).

- ``Host`` not one of the app's names (DNS rebinding): 421, before anything runs.
- ``Origin`` present and not the origin ``Host`` names, for any method and for the WebSocket handshake (browsers
  send it on every cross-origin fetch, EventSource, upload and form post, and on every same-origin POST); lacking
  ``Origin``, a foreign ``Referer`` on a POST/PUT/PATCH/DELETE: 403. So another site can neither upload, join the
  queue nor read a response with the visitor's cookies.
- ``/gradio_api/file=<URL>`` (Gradio fetches a public URL for it) and ``/gradio_api/proxy=``: 403, before Gradio
  fetches anything; the app serves its own files only.
- When others can reach the app, an upload past its visitor's budget or the upload folder's (``app.upload_budget``):
  429 / 413 with the reason, before a byte of it is read.
- A JSON body over 64 MiB (413), or naming a file by URL, which Gradio would download into the upload folder outside
  the budget (403, ``app.request_body``); ``/gradio_api/process_recording`` (a screen recording run through ffmpeg,
  no part of this app): 403.
- ``Access-Control-Allow-Origin`` naming another origin (Gradio echoes any origin for a non-loopback ``Host``, the
  share link's included) is dropped with its ``-Credentials``.

Gradio adds its CORS layer outside the middleware the app passes in, and it answers a preflight itself; so
``guard_lifespan`` (a lifespan, run before the first request) wraps the whole stack in the guard as well. The inner copy
(in ``app_kwargs["middleware"]``) stays as the floor, should the lifespan ever not run; the outer one marks the
request so that the inner one does not check it twice.
"""

from __future__ import annotations

import logging
import re
from contextlib import asynccontextmanager

from app import request_body
from app.hosts import AllowedHosts, origin_matches
from app.upload_budget import UPLOAD_PATH, UploadBudget, visitor_of

logger = logging.getLogger("headinfer.guard")

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Gradio fetches http(s) URLs for file=; any scheme-shaped path is refused (two letters or more: C:\ is a Windows
# drive), and proxy= (Spaces only) too.
FETCHING_PATH = re.compile(r"^(?:/gradio_api)?/(?:file=[a-z][a-z0-9+.\-]+:|proxy=)", re.IGNORECASE)
UNUSED_PATH = re.compile(r"^(?:/gradio_api)?/process_recording/?$", re.IGNORECASE)  # Gradio's, not the app's
_CHECKED = "headinfer.guarded"


class RequestGuard:
    """Refuses requests for another host, from another origin, or for a remote URL (see the module's text)."""

    def __init__(self, app, hosts: AllowedHosts | None = None, budget: UploadBudget | None = None) -> None:
        self.app = app
        self.hosts = hosts or AllowedHosts()
        self.budget = budget or (UploadBudget() if self.hosts.others_reach else None)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get(_CHECKED):
            await self.app(scope, receive, send)
            return
        scope[_CHECKED] = True
        headers = {}
        for key, value in scope.get("headers", []):
            headers.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
        refusal = self.refusal(scope, headers) or self.over_budget(scope, headers)
        if refusal is None and scope.get("method") == "POST" and not UPLOAD_PATH.match(scope.get("path", "")):
            refusal, receive = await request_body.screened(headers, receive)  # files inside a JSON body
        if refusal is not None:
            status, text = refusal
            logger.info("refused %s %r (Host %r, Origin %r): %s", scope.get("method", "WS"), scope.get("path"),
                        headers.get("host"), headers.get("origin"), text)
            await _refuse(scope, send, status, text)
            return
        host = headers.get("host", "")
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_own_cors(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": _own_cors(message.get("headers", []), host)}
            await send(message)

        await self.app(scope, receive, send_own_cors)

    def refusal(self, scope, headers: dict[str, str]) -> tuple[int, str] | None:
        """``(status, text)`` when the request is refused, else None."""
        host = headers.get("host", "")
        server = scope.get("server") or (None, None)
        if not self.hosts.allows(host, server[0]):
            return 421, "This app does not answer to that host name."
        origin = headers.get("origin")
        if origin is not None and not self.hosts.own_origin(origin, host):
            return 403, "Cross-site request refused: this app answers its own page only."
        referer = headers.get("referer")
        if origin is None and referer and scope.get("method") in UNSAFE_METHODS and \
                not self.hosts.own_origin(referer, host):
            return 403, "Cross-site request refused: this app answers its own page only."
        if FETCHING_PATH.match(scope.get("path", "")):
            return 403, "This app serves its own files only, not URLs."
        if UNUSED_PATH.match(scope.get("path", "")):
            return 403, "This app takes no recordings."
        return None

    def over_budget(self, scope, headers: dict[str, str]) -> tuple[int, str] | None:
        """``(status, text)`` when an upload is past its visitor's or the folder's budget, else None."""
        if self.budget is None or scope.get("method") != "POST" or not UPLOAD_PATH.match(scope.get("path", "")):
            return None
        length = headers.get("content-length", "")
        return self.budget.take(visitor_of(scope, headers), int(length) if length.isdigit() else None)


def guard_lifespan(hosts: AllowedHosts):
    """A lifespan (for ``app_kwargs["lifespan"]``) that wraps the app's whole middleware stack, Gradio's CORS
    included, in a ``RequestGuard``: it runs as the server starts, before any request is taken."""

    @asynccontextmanager
    async def lifespan(app):
        if app.middleware_stack is None:
            app.middleware_stack = app.build_middleware_stack()
        app.middleware_stack = RequestGuard(app.middleware_stack, hosts)
        yield

    return lifespan


def _own_cors(headers: list, host: str) -> list:
    """``headers`` without an ``Access-Control-Allow-Origin`` for another origin (nor its ``-Credentials``)."""
    allowed = [value.decode("latin-1") for key, value in headers if key.lower() == b"access-control-allow-origin"]
    if all(origin_matches(value, host) for value in allowed):
        return headers
    drop = {b"access-control-allow-origin", b"access-control-allow-credentials"}
    return [(key, value) for key, value in headers if key.lower() not in drop]


async def _refuse(scope, send, status: int, text: str) -> None:
    if scope["type"] == "websocket":  # closing before accepting: the server answers the handshake with 403
        await send({"type": "websocket.close", "code": 1008})
        return
    body = (text + "\n").encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})

