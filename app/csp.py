"""A Content-Security-Policy for every response: the page runs the app's own script and talks to the app only.

Answers are Markdown written by the model and panels show a document's names, so a slip in escaping must not turn
into script: no inline script but the page's own (each allowed by its SHA-256, counted from the page as it is
served and from the app's ``head`` script), no inline event handler, no script, connection, image, media, frame or
font from elsewhere, no framing by another site, no ``<base>`` or form elsewhere. What Gradio 6 needs besides,
seen in Chromium: ``'unsafe-eval'`` (``gr.HTML`` renders every panel through ``Function``, HTML-*.js, and event
``js=`` functions are compiled the same way, Blocks-*.js), inline styles (Svelte's ``style=`` and the theme's
``<style>``), and ``<base href="./">`` (so ``base-uri 'self'``). A ``--share`` page is Gradio's ``share.html``,
which loads the front end from Gradio's CDN: that one folder (this Gradio version's) is allowed for scripts then,
and the CDN's host for styles and fonts (the stylesheet is also asked for from its top ``/assets/``).
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path
from urllib.parse import urlsplit

import gradio

_SHARE_PAGE = Path(gradio.__file__).resolve().parent / "templates" / "frontend" / "share.html"
_INLINE_SCRIPT = re.compile(rb"<script\b(?![^>]*\bsrc\s*=)[^>]*>(.*?)</script\s*>", re.IGNORECASE | re.DOTALL)
# Beside the policy on every response: no type sniffing (an uploaded .js served as a download must not run from a
# <script src>, which 'self' would allow), and no full URL sent to another site.
_ALSO = ((b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"same-origin"))
_REPLACED = frozenset({b"content-security-policy", *(name for name, _ in _ALSO)})
_PAGE_PATHS = frozenset({"/", ""})  # the app's page; a file served from elsewhere never has its scripts allowed


def share_front_end() -> str | None:
    """The CDN folder Gradio's share page loads its front end from (``https://…/<version>/``), or None."""
    try:
        found = re.search(r'src="(https://[^"]+/)gradio\.js"', _SHARE_PAGE.read_text(encoding="utf-8"))
    except OSError:
        return None
    return found.group(1) if found else None


def script_hash(text: str | bytes) -> str:
    """The CSP source that allows an inline script whose text is ``text``."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    return "'sha256-" + base64.b64encode(hashlib.sha256(data).digest()).decode() + "'"


def policy(script_hashes=(), *, share: bool = False) -> str:
    """The header's value: ``script_hashes`` (``script_hash`` sources) allowed inline; ``share`` adds Gradio's
    front-end folder on its CDN for scripts, and that host for styles and fonts."""
    cdn = share_front_end() if share else None
    extra = f" {cdn}" if cdn else ""
    # Its stylesheet is also asked for from the CDN's top /assets/ folder: styles and fonts from that host.
    looks = f" {urlsplit(cdn).scheme}://{urlsplit(cdn).netloc}" if cdn else ""
    return "; ".join([
        "default-src 'self'",
        f"script-src 'self' 'unsafe-eval'{''.join(' ' + h for h in dict.fromkeys(script_hashes))}{extra}",
        f"style-src 'self' 'unsafe-inline'{looks}",
        f"font-src 'self' data:{looks}",
        "img-src 'self' data: blob:",
        "media-src 'self' data: blob:",
        "connect-src 'self'",
        "frame-src 'self'",
        "object-src 'none'",
        "frame-ancestors 'none'",
        "base-uri 'self'",
        "form-action 'self'",
    ])


class ContentSecurityPolicy:
    """ASGI middleware that adds the policy to each HTTP response; for the app's page it also allows the page's
    own inline scripts (Gradio writes its config into them, so their hashes change with the page)."""

    def __init__(self, app, script_texts=(), share: bool = False) -> None:
        self.app = app
        self.hashes = tuple(script_hash(text) for text in script_texts)
        self.share = share
        self.plain = policy(self.hashes, share=share).encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        page = scope.get("path") in _PAGE_PATHS
        held: list = []  # the page's response, held until its body is whole

        async def send_with_policy(message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _REPLACED]
                headers.extend(_ALSO)
                message = {**message, "headers": headers}
                if page and _is_html(headers):
                    held.append(message)
                    return
                message["headers"] = [*headers, (b"content-security-policy", self.plain)]
            elif held:
                held.append(message)
                if message.get("more_body", False):
                    return
                await self._send_page(held, send)
                return
            await send(message)

        await self.app(scope, receive, send_with_policy)

    async def _send_page(self, held: list, send) -> None:
        start, *bodies = held
        html = b"".join(message.get("body", b"") for message in bodies)
        hashes = (*self.hashes, *(script_hash(body) for body in _INLINE_SCRIPT.findall(html)))
        start["headers"] = [*start["headers"], (b"content-security-policy", policy(hashes, share=self.share).encode())]
        await send(start)
        for message in bodies:
            await send(message)
        held.clear()


def _is_html(headers: list) -> bool:
    return any(k.lower() == b"content-type" and v.lower().startswith(b"text/html") for k, v in headers)
