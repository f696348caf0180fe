"""A Content-Security-Policy for every page the app serves: images, media and frames only from the app
itself. Answers are Markdown written by the model, and a document can lead it to write an image link;
without this the visitor's browser would fetch that URL (a tracking pixel, or worse)."""

from __future__ import annotations

POLICY = "img-src 'self' data: blob:; media-src 'self' data: blob:; frame-src 'self'; object-src 'none'"


class ContentSecurityPolicy:
    """ASGI middleware that adds :data:`POLICY` to each HTTP response."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_policy(message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"content-security-policy"]
                message = {**message, "headers": [*headers, (b"content-security-policy", POLICY.encode())]}
            await send(message)

        await self.app(scope, receive, send_with_policy)
