"""A browser's own id, so that a visitor kept apart without a login finds their saved documents again after a reload.

Gradio gives a reloaded page a new session hash, and a visitor's shelf was keyed by it (``app.saved.shelves``): the tab's
document, saved, could not be reopened. The page's first answer sets a random 256-bit id in an HttpOnly,
SameSite=Lax session cookie (gone when the browser closes) when the request has none; every later request of that
browser sends it, and the shelves key a visitor's shelf by it. It is trusted for nothing else: a client that makes one
up gets an empty shelf of its own (all visitors' shelves together stay within their total), and without a
well-formed one the shelf is the tab's, as before. Lax, not Strict: a share link opened from another site must send
the id back, or the page would set a new one and lose the shelf.
"""

from __future__ import annotations

import re
import secrets
from http.cookies import SimpleCookie

from starlette.requests import cookie_parser

COOKIE = "headinfer-browser"
_WELL_FORMED = re.compile(r"^[A-Za-z0-9_-]{43}$")  # secrets.token_urlsafe(32)


def browser_id(request) -> str | None:
    """The id the request's browser sent (a ``gr.Request`` or a starlette request), when it is well formed."""
    try:
        value = dict(getattr(request, "cookies", None) or {}).get(COOKIE)
    except (AttributeError, TypeError):  # a gr.Request made without an HTTP request has no cookies
        return None
    return value if isinstance(value, str) and _WELL_FORMED.match(value) else None


class BrowserIdCookie:
    """ASGI middleware: a page (an HTML answer to a GET) for a browser without a well-formed id sets a new one."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("method") != "GET" or _sent_id(scope):
            await self.app(scope, receive, send)
            return

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start" and _is_html(message.get("headers", [])):
                message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", _new_cookie())]}
            await send(message)

        await self.app(scope, receive, send_with_id)


def _sent_id(scope) -> bool:
    for key, value in scope.get("headers", []):
        if key.lower() == b"cookie" and _WELL_FORMED.match(cookie_parser(value.decode("latin-1")).get(COOKIE, "")):
            return True
    return False


def _is_html(headers) -> bool:
    return any(key.lower() == b"content-type" and value.lower().startswith(b"text/html") for key, value in headers)


def _new_cookie() -> bytes:
    cookie = SimpleCookie()
    cookie[COOKIE] = secrets.token_urlsafe(32)
    cookie[COOKIE].update({"path": "/", "httponly": True, "samesite": "Lax"})
    return cookie[COOKIE].OutputString().encode()
