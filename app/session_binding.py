"""A tab's session hash belongs to the browser that first used it.

Gradio finds a tab's event stream (``/queue/data``), its events (``/queue/join``, ``/call``, ``/run``, ``/api``), their
cancelling, its heartbeat, its media streams, its component calls and its deep link by the session hash alone, a
name the page makes up and sends in the clear: whoever holds another tab's hash could read that tab's answers and
documents as they stream, or push events into it. ``SessionBinding`` binds each hash, on the first request that names
it, to that request's browser id cookie (``app.browser_id``), and refuses (403, one line) any later request naming it
from another cookie or from none. A client that sends no cookie (``gradio_client``, a script) binds its hash to "no
cookie": its hash is a random one of its own making, and it cannot take a browser's tab, whose hash is bound to that
browser's cookie. A reload is a new hash, bound anew.

A hash is held while a request naming it is open (a page's heartbeat stays open while its tab does) and forgotten
``IDLE_SECONDS`` after its last one ended, past Gradio's own hour for a closed tab's state. At most ``CAPACITY`` idle
hashes are held (the longest idle forgotten first); open ones are never forgotten nor refused, so a visitor holding
open requests cannot lock new tabs out (a 503 here did, once they held ``CAPACITY``). A request names at most one hash
in its query, so the open ones number at most three a request, and the server holds each open request anyway.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl

from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse

from app.browser_id import browser_id
from app.request_body import BODY_LIMIT, read_whole

logger = logging.getLogger("headinfer.session_binding")

IDLE_SECONDS = 2 * 3600.0  # Gradio keeps a closed tab's state for an hour; its hash stays bound past that
CAPACITY = 10_000  # Gradio's own default number of sessions it keeps state for
SWEEP_SECONDS = 60.0
MAX_HASH = 256  # characters: Gradio's page makes ~11, gradio_client a 36-character uuid
NOT_YOURS = "This tab's session belongs to another browser: refused."
# Hash-keyed routes with the hash in the path: the heartbeat and the GET media streams (/stream/{event_id} is not one).
_IN_PATH = re.compile(r"^(?:/gradio_api)?/(?:heartbeat/([^/]+)/?|stream/([^/]+)/[^/]+/[^/]+/[^/]+)$")
# POST routes whose JSON body names a session hash (Gradio reads component_server's as JSON whatever its type).
_IN_BODY = re.compile(r"^(?:/gradio_api)?/(?:queue/join|cancel|component_server|run/.+|api/.+|call/.+)/?$")
_COMPONENT_SERVER = re.compile(r"^(?:/gradio_api)?/component_server/?$")


@dataclass
class _Binding:
    browser: str | None  # the browser id cookie of the request that first named the hash; None: no cookie
    open: int = 0  # requests naming the hash now in flight
    last: float = 0.0  # when the last one started or ended


class SessionBindings:
    """Which browser each session hash belongs to (see the module's text). Used from the server's one event loop
    only: ``claim`` and ``release`` never await, so they need no lock."""

    def __init__(self, capacity: int = CAPACITY, idle_seconds: float = IDLE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity, self.idle_seconds, self.clock = capacity, idle_seconds, clock
        self._held: OrderedDict[str, _Binding] = OrderedDict()  # least recently used first
        self._swept = clock()

    def __len__(self) -> int:
        return len(self._held)

    def claim(self, hashes: set[str], browser: str | None) -> tuple[int, str] | None:
        """Binds each of ``hashes`` not held to ``browser`` and counts a request open on each; None when they are
        all ``browser``'s, else the refusal's ``(status, reason)`` (nothing counted): 403, another browser's."""
        now = self.clock()
        if now - self._swept > SWEEP_SECONDS:
            self._sweep(now)
        for session_hash in hashes:
            held = self._held.get(session_hash)
            if held is not None and not self._expired(held, now) and held.browser != browser:
                return 403, NOT_YOURS
        self._make_room(sum(session_hash not in self._held for session_hash in hashes), now)
        for session_hash in hashes:
            held = self._held.get(session_hash)
            if held is None or self._expired(held, now):
                held = self._held[session_hash] = _Binding(browser)
            held.open, held.last = held.open + 1, now
            self._held.move_to_end(session_hash)
        return None

    def release(self, hashes: set[str]) -> None:
        """The request ``claim`` counted on ``hashes`` has ended."""
        now = self.clock()
        for session_hash in hashes:
            held = self._held.get(session_hash)
            if held is not None:
                held.open, held.last = max(held.open - 1, 0), now
                self._held.move_to_end(session_hash)

    def _expired(self, held: _Binding, now: float) -> bool:
        return held.open == 0 and now - held.last > self.idle_seconds

    def _sweep(self, now: float) -> None:
        self._swept = now
        for session_hash in [h for h, held in self._held.items() if self._expired(held, now)]:
            del self._held[session_hash]

    def _make_room(self, new: int, now: float) -> None:
        """Forgets the longest idle hashes until ``new`` more fit in the capacity, or none idle is left (open ones are
        never forgotten: their requests are the server's to bound)."""
        if len(self._held) + new <= self.capacity:
            return
        self._sweep(now)
        idle = [session_hash for session_hash, held in self._held.items() if held.open == 0]
        for session_hash in idle[:max(len(self._held) + new - self.capacity, 0)]:
            del self._held[session_hash]


class SessionBinding:
    """ASGI middleware: a request naming a session hash bound to another browser's cookie is refused with 403."""

    def __init__(self, app, bindings: SessionBindings | None = None) -> None:
        self.app = app
        self.bindings = bindings if bindings is not None else SessionBindings()  # an empty one is falsy

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        hashes, receive, refusal = await _named_hashes(scope, receive)
        if refusal is None and hashes:
            refusal = self.bindings.claim(hashes, browser_id(HTTPConnection(scope)))
        if refusal is not None:
            logger.info("refused %s %r: %s", scope.get("method"), scope.get("path"), refusal[1])
            await PlainTextResponse(refusal[1] + "\n", status_code=refusal[0])(scope, receive, send)
            return
        if not hashes:
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.bindings.release(hashes)


async def _named_hashes(scope, receive) -> tuple[set[str], Callable, tuple[int, str] | None]:
    """``(hashes, receive, refusal)``: the session hashes the request names (query, path, JSON body), a ``receive``
    that hands the app the body read, and a refusal when the request cannot be looked into."""
    in_query = [value for key, value in parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                                                  keep_blank_values=True) if key == "session_hash"]
    if len(in_query) > 1:  # Gradio's page names one; many would hold that many hashes on one open request
        return set(), receive, (400, "A request names at most one session hash.")
    hashes = set(in_query)
    path = scope.get("path", "")
    in_path = _IN_PATH.match(path)
    if in_path:
        hashes.add(in_path.group(1) or in_path.group(2))
    if scope.get("method") == "POST" and _IN_BODY.match(path):
        kind = dict(scope.get("headers", [])).get(b"content-type", b"").lower()
        if kind.startswith(b"multipart/") and _COMPONENT_SERVER.match(path):
            return hashes, receive, (403, "This app takes no files through component calls.")
        body, receive = await read_whole(receive)
        if body is None:
            return hashes, receive, (413, f"Request refused: a request body may take at most {BODY_LIMIT >> 20} MiB.")
        hashes |= _body_hash(body)
    if any(len(session_hash) > MAX_HASH for session_hash in hashes):
        return hashes, receive, (400, f"A session hash is at most {MAX_HASH} characters.")
    return hashes, receive, None


def _body_hash(body: bytes) -> set[str]:
    """The ``session_hash`` a JSON body names, parsed as the route parses it (``json.loads``: the last of repeated
    keys); none for a body that is no JSON object (the route refuses it itself)."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        return set()
    value = payload.get("session_hash") if isinstance(payload, dict) else None
    return {value} if isinstance(value, str) else set()
