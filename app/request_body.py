"""What a request's JSON body may carry (``app.guard``).

Gradio's data routes (``/queue/join``, ``/run/…``, ``/api/…``, ``/call/…``, ``/stream/…``) take files inside their
JSON as ``FileData`` objects (``{"path": …, "meta": {"_type": "gradio.FileData"}}``). A local ``path`` must be in the
upload folder (Gradio checks it), so it was counted by the upload budget when it was uploaded; but a ``path`` that is
an http(s) URL is downloaded by Gradio into the upload folder, whole, with no size limit and outside the budget
(``processing_utils.async_ssrf_protected_download``). So a JSON body is read (at most ``BODY_LIMIT`` bytes, said
before reading when it has a ``Content-Length``), refused when a file object in it names a URL, and handed on
unchanged otherwise. Its ``url`` field is not looked at: Gradio ignores it on input, and the page echoes the
``/gradio_api/file=`` URLs it was given.
"""

from __future__ import annotations

import json
import re

BODY_LIMIT = 64 << 20  # bytes: a question's 1,000,000 characters (app.questions) and its chat many times over
_SCHEME = re.compile(r"^[a-z][a-z0-9+.\-]+:", re.IGNORECASE)  # "https:", "data:" (two letters or more: not C:\)


def is_json_body(headers: dict[str, str]) -> bool:
    """Whether FastAPI reads this body as JSON: no content type, or an ``application/json`` (``+json``) one."""
    kind = headers.get("content-type", "").split(";")[0].strip().lower()
    return not kind or kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def url_files(payload) -> list[str]:
    """The ``path`` of every file object in ``payload`` (parsed JSON) that is a URL, not a path; walked without
    recursion, so a deeply nested body costs no stack."""
    found, stack = [], [payload]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            path = item.get("path")
            if isinstance(path, str) and _SCHEME.match(path.strip()):
                found.append(path)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def refusal(body: bytes) -> tuple[int, str] | None:
    """``(status, reason)`` for a JSON body that names a file by URL, else None (a body that is no JSON is left to
    the route, which refuses it itself)."""
    try:
        payload = json.loads(body)
    except RecursionError:
        return 400, "Request refused: its JSON is nested too deeply."
    except ValueError:
        return None
    if url_files(payload):
        return 403, "This app takes files by upload only, not by URL: nothing was fetched."
    return None


async def screened(headers: dict[str, str], receive):
    """``(refusal or None, receive)`` for an http POST: a JSON body is read whole (at most ``BODY_LIMIT`` bytes) and
    checked (``refusal``); the ``receive`` returned hands the app the same body. Other bodies pass unread."""
    if not is_json_body(headers):  # uploads (multipart) and the login form: not looked into here
        return None, receive
    length = headers.get("content-length", "")
    too_long = 413, f"Request refused: a request body may take at most {BODY_LIMIT >> 20} MiB."
    if length.isdigit() and int(length) > BODY_LIMIT:
        return too_long, receive
    body, receive = await read_whole(receive)
    if body is None:
        return too_long, receive
    return (None if body is LEFT else refusal(body)), receive


class _Left(bytes):
    """An empty body that is not any client's own empty body."""


#: What ``read_whole`` gives for a client that left mid-body (the replayed ``receive`` tells the app it left).
LEFT = _Left()


async def read_whole(receive):
    """``(body, receive)``: the whole body (None past ``BODY_LIMIT``; ``LEFT`` if the client left first) and a
    ``receive`` that hands the app the same messages again."""
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":  # the client left: the app sees it leave
            return LEFT, _replay([], message, receive)
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > BODY_LIMIT:
            return None, receive
        more = message.get("more_body", False)
    body = b"".join(chunks)
    return body, _replay([body], None, receive)


def _replay(bodies: list[bytes], then, receive):
    """A ``receive`` that gives the app ``bodies`` as one request message (or ``then``), then the real ``receive``."""
    pending = [{"type": "http.request", "body": b"".join(bodies), "more_body": False}] if then is None else [then]

    async def replayed():
        return pending.pop(0) if pending else await receive()

    return replayed
