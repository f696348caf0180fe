"""Who owns the app: the person who started it. When others can reach it (``--share``, a non-loopback ``--host``),
the model picker's actions (scanning folders, downloading, serving a model) are the owner's alone.

The address of a request proves nothing (the share tunnel's requests arrive from loopback), so ownership is a
secret: ``launch.py`` makes a random key at start-up, kept in memory only (a restart makes a new one), and logs an
owner link ``/?owner=KEY`` on the console, never on the page. ``OwnerLink`` (ASGI middleware) turns a visit to that
link into an HttpOnly, SameSite=Strict cookie holding a token derived from the key (never the key itself) and
redirects to ``/``, so the key leaves the address bar and the history. ``OwnerGate.is_owner`` checks that cookie on
a handler's ``gr.Request``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from urllib.parse import parse_qs

from starlette.middleware import Middleware

logger = logging.getLogger(__name__)

COOKIE = "headinfer_owner"
QUERY = "owner"
_TOKEN_LABEL = b"headinfer-studio owner cookie v1"
REFUSED = ("The model picker is the owner's: scanning this machine's folders, downloading and serving a model need "
           "the owner link printed in the console where the app was started.")


@dataclass(frozen=True)
class OwnerGate:
    """``key``: the owner's secret; None when nobody else can reach the app, and then every request is the owner's
    (a plain local ``python launch.py``)."""

    key: str | None = field(default=None, repr=False)

    @property
    def private(self) -> bool:
        return self.key is not None

    @property
    def token(self) -> str:
        """What the owner's cookie holds: derived from the key, so the cookie never carries the key itself."""
        if self.key is None:
            raise ValueError("an open gate has no owner token")
        return hmac.new(self.key.encode(), _TOKEN_LABEL, hashlib.sha256).hexdigest()

    def opens_with(self, key: str | None) -> bool:
        return self.key is not None and key is not None and hmac.compare_digest(key.encode(), self.key.encode())

    def is_owner(self, request) -> bool:
        """Whether ``request`` (a ``gr.Request``, a starlette ``Request``, or None when called directly) is the
        owner's: always when the gate is open, else only with the owner's cookie."""
        if self.key is None:
            return True
        if request is None:
            return False
        try:
            cookies = dict(getattr(request, "cookies", None) or {})
        except (AttributeError, TypeError):  # a gr.Request made without an HTTP request has no cookies
            cookies = {}
        value = cookies.get(COOKIE)
        return isinstance(value, str) and hmac.compare_digest(value.encode(), self.token.encode())

    def link(self, base: str) -> str:
        """The owner link on ``base`` (``http://127.0.0.1:7860``): for the console only."""
        return f"{base.rstrip('/')}/?{QUERY}={self.key}"


OPEN = OwnerGate()


def new_gate(private: bool) -> OwnerGate:
    """A gate with a fresh random key when others can reach the app; the open gate otherwise."""
    return OwnerGate(secrets.token_urlsafe(32)) if private else OPEN


class OwnerLink:
    """ASGI middleware: ``GET /?owner=KEY`` with the right key sets the owner's cookie and redirects to ``/``; with a
    wrong key the page is served as to any visitor (no cookie). Everything else passes through untouched."""

    def __init__(self, app, gate: OwnerGate) -> None:
        self.app, self.gate = app, gate

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not self.gate.private or scope.get("path") != "/":
            await self.app(scope, receive, send)
            return
        keys = parse_qs(scope.get("query_string", b"").decode("latin-1")).get(QUERY)
        if not keys:
            await self.app(scope, receive, send)
            return
        if not self.gate.opens_with(keys[0]):
            logger.warning("an owner link with a wrong key was opened; served as a visitor")
            await self.app(scope, receive, send)
            return
        cookie = SimpleCookie()
        cookie[COOKIE] = self.gate.token
        cookie[COOKIE].update({"path": "/", "httponly": True, "samesite": "Strict"})
        logger.info("the owner link was opened: this browser is the owner's until it closes")
        await send({"type": "http.response.start", "status": 303,
                    "headers": [(b"location", b"/"), (b"cache-control", b"no-store"),
                                (b"set-cookie", cookie[COOKIE].OutputString().encode()),
                                (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


def owner_middleware(gate: OwnerGate | None) -> list[Middleware]:
    """The middleware for ``Blocks.launch``'s app: the owner link's, when the gate has a key; none otherwise."""
    return [Middleware(OwnerLink, gate=gate)] if gate is not None and gate.private else []
