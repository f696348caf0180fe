"""The API key's check, outside everything else on the server: a request for ``/v1/…`` without the key is answered
401 before a byte of its body is read.

The page's guard (``app.guard``, wrapped around the whole stack by its lifespan) reads a JSON body whole, up to
``app.request_body.BODY_LIMIT``, to screen it for files named by URL; the routes checked the key only after it. So
anyone who could reach the port made the app hold that much per request without any key. ``api_lifespan`` wraps
the stack once more, after the guard's lifespan has wrapped it, so this gate runs first; the routes still check the
key themselves (the floor, should the lifespan not run) and count the body as it arrives
(``app.openai_api.routes._body``).
"""

from __future__ import annotations

import json
import logging
from contextlib import asynccontextmanager

from app.openai_api.keys import allows
from app.openai_api.schema import ApiError

logger = logging.getLogger(__name__)

API_PREFIX = "/v1/"
MISSING_KEY = ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>' with the key this app "
                            "was started with (--api-key / HEADINFER_API_KEY).", code="invalid_api_key")


class ApiKeyGate:
    """ASGI middleware: a ``/v1/`` request without ``key`` gets the 401 at once (nothing read, nothing run)."""

    def __init__(self, app, key: str | None) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or self.key is None or not scope.get("path", "").startswith(API_PREFIX):
            await self.app(scope, receive, send)
            return
        authorization = next((value.decode("latin-1") for name, value in scope.get("headers", [])
                              if name.lower() == b"authorization"), None)
        if allows(self.key, authorization):
            await self.app(scope, receive, send)
            return
        logger.info("refused %s %r: no API key or a wrong one (its body unread)", scope.get("method"), scope["path"])
        body = json.dumps(MISSING_KEY.body()).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer"), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def api_lifespan(inner, key: str | None):
    """A lifespan that runs ``inner`` (the guard's, which wraps the stack; None: none) and then wraps the result
    in ``ApiKeyGate``, outermost."""

    @asynccontextmanager
    async def lifespan(app):
        if inner is None:
            if app.middleware_stack is None:
                app.middleware_stack = app.build_middleware_stack()
            app.middleware_stack = ApiKeyGate(app.middleware_stack, key)
            yield
            return
        async with inner(app) as state:
            app.middleware_stack = ApiKeyGate(app.middleware_stack, key)
            yield state

    return lifespan
