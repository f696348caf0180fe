"""The OpenAI-compatible routes, served on the app's own server (``launch.py --api``): ``GET /v1/models``,
``POST /v1/chat/completions``, ``POST /v1/completions`` (streamed as server-sent events, or whole), and the extension
``GET /v1/documents`` (what a prompt may begin with to reuse a held document's K/V).

They sit behind the same guard as the page (``app.guard``: Host allow-list, Origin check, no CORS echoed), so a web page
elsewhere can never call them from a visitor's browser; stock clients (scripts, Open WebUI's server) send no Origin.
The compute runs on a worker thread (``app.openai_api.completions``); a client that disconnects stops it and frees its
place in the line. Usage: every whole response has it, and a stream's last chunk (the one with ``finish_reason``)
always carries it, with OpenAI's own usage-only chunk after it when ``stream_options.include_usage`` asks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid
from collections.abc import Callable

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from app.openai_api import schema
from app.openai_api.gate import MISSING_KEY
from app.openai_api.keys import allows
from app.openai_api.library import Library
from app.openai_api.naming import public_id
from app.openai_api.prefixes import documents_listing
from app.openai_api.completions import Completions

logger = logging.getLogger(__name__)

MAX_BODY = 64 * 2**20  # bytes: a request carrying a whole book is a few MB
KEEP_ALIVE = 5.0  # seconds between SSE comments while a request waits in line
# API requests waiting or answering at once (a worker thread and a place in the page's line each): past it a 429.
# Before, 60 parallel streams made 60 threads and 60 places ahead of the page's visitors.
MAX_IN_FLIGHT = 8


class OpenAIRoutes:
    """``routes()`` for ``Blocks.launch(app_kwargs={"routes": ...})``; ``model_name()``: the served model's id."""

    def __init__(self, library: Library, model_name: Callable[[], str], key: str | None = None):
        self.library, self.model_name, self.key = library, model_name, key
        self.completions = Completions(library.app, library)
        self.in_flight, self._count = 0, threading.Lock()

    def routes(self) -> list[Route]:
        return [Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/documents", self.documents, methods=["GET"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.complete, methods=["POST"])]

    # -- endpoints ----------------------------------------------------------------------------------
    async def models(self, http: HttpRequest):
        if (refused := self._refused(http)) is not None:
            return refused
        return JSONResponse({"object": "list", "data": [{"id": public_id(self.model_name()), "object": "model",
                                                         "created": 0, "owned_by": "headinfer-studio"}]})

    async def documents(self, http: HttpRequest):
        if (refused := self._refused(http)) is not None:
            return refused
        listing = await asyncio.to_thread(documents_listing, self.library)
        return JSONResponse({"object": "list", "data": listing})

    async def chat(self, http: HttpRequest):
        return await self._serve(http, schema.chat_request)

    async def complete(self, http: HttpRequest):
        return await self._serve(http, schema.completion_request)

    # -- the work -----------------------------------------------------------------------------------
    async def _serve(self, http: HttpRequest, parse):
        if (refused := self._refused(http)) is not None:
            return refused
        try:
            request = parse(schema.parse_body(await _body(http)))
            if request.model not in self._model_ids():
                raise schema.ApiError(404, f"The model {request.model!r} does not exist here; GET /v1/models lists "
                                           f"{public_id(self.model_name())!r}.", code="model_not_found",
                                      param="model")
            self._take_place()  # before the check: tokenizing a long prompt is work too
            try:
                checked = await asyncio.to_thread(self.completions.check, request)
            except BaseException:
                self._give_place()
                raise
        except schema.ApiError as exc:
            return _error(exc)
        ident = ("chatcmpl-" if request.prompt is None else "cmpl-") + uuid.uuid4().hex[:24]
        events, gone = self._start(checked)
        if request.stream:
            return StreamingResponse(self._stream(request, ident, events, gone), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await self._whole(http, request, ident, events, gone)

    def _start(self, checked) -> tuple[asyncio.Queue, threading.Event]:
        """Runs the completion on a worker thread, its reports put on an asyncio queue; ``gone`` stops it."""
        loop, events, gone = asyncio.get_running_loop(), asyncio.Queue(), threading.Event()

        def report(item: tuple) -> None:
            loop.call_soon_threadsafe(events.put_nowait, item)

        def work() -> None:
            try:
                self.completions.run(checked, report, gone.is_set)
            except schema.ApiError as exc:
                report(("error", exc))
            except Exception as exc:  # a bug or the device: the client hears of it, the app stays up
                logger.exception("API completion failed")
                report(("error", schema.ApiError(500, f"The answer failed: {exc}", kind="server_error")))
            finally:
                self._give_place()
                report(("finished",))

        threading.Thread(target=work, name="api-completion", daemon=True).start()
        return events, gone

    async def _whole(self, http: HttpRequest, request, ident: str, events: asyncio.Queue, gone: threading.Event):
        text = []
        try:
            while True:
                try:
                    item = await asyncio.wait_for(events.get(), timeout=0.5)
                except asyncio.TimeoutError:
                    if await http.is_disconnected():
                        gone.set()
                        return JSONResponse({}, status_code=499)
                    continue
                if item[0] == "text":
                    text.append(item[1])
                elif item[0] == "error":
                    return _error(item[1])
                elif item[0] == "end":
                    _, finish, counts, extra = item
                    return JSONResponse(schema.response(request, ident, "".join(text), finish, counts, extra))
                elif item[0] == "finished":
                    return _error(schema.ApiError(500, "The answer ended without a result.", kind="server_error"))
        finally:
            gone.set()  # done, or the client went: either way the worker stops

    async def _stream(self, request, ident: str, events: asyncio.Queue, gone: threading.Event):
        try:
            if request.prompt is None:
                yield _sse(schema.chunk(request, ident, "", first=True))
            while True:
                try:
                    item = await asyncio.wait_for(events.get(), timeout=KEEP_ALIVE)
                except asyncio.TimeoutError:
                    yield ": waiting for the compute device\n\n"  # a comment: clients skip it
                    continue
                if item[0] == "text":
                    yield _sse(schema.chunk(request, ident, item[1]))
                elif item[0] == "error":
                    yield _sse(item[1].body())
                    break
                elif item[0] == "end":
                    _, finish, counts, extra = item
                    yield _sse(schema.chunk(request, ident, None if request.prompt is None else "", finish,
                                            counts=counts, extra=extra))
                    if request.include_usage:
                        yield _sse(schema.chunk(request, ident, None, counts=counts, no_choice=True))
                    break
                elif item[0] == "finished":
                    break
            yield "data: [DONE]\n\n"
        finally:
            gone.set()  # a client that disconnected mid-stream: its answer stops, its place in line goes

    # -- checks -------------------------------------------------------------------------------------
    def _take_place(self) -> None:
        """One of the ``MAX_IN_FLIGHT`` places (given back when its worker ends), or a 429 to retry later."""
        with self._count:
            if self.in_flight >= MAX_IN_FLIGHT:
                raise schema.ApiError(429, f"{MAX_IN_FLIGHT} API requests are waiting or answering already; retry "
                                           "when one has finished.", kind="rate_limit_error", code="too_many_requests")
            self.in_flight += 1

    def _give_place(self) -> None:
        with self._count:
            self.in_flight -= 1

    def _model_ids(self) -> set[str]:
        """The id ``/v1/models`` lists, and the served name as launched (a client given it by the owner)."""
        name = self.model_name()
        return {public_id(name), name, name.rstrip("/").rsplit("/", 1)[-1]}

    def _refused(self, http: HttpRequest) -> JSONResponse | None:
        if allows(self.key, http.headers.get("authorization")):
            return None
        return _error(MISSING_KEY)  # (``app.openai_api.gate`` answers it first, its body unread)


async def _body(http: HttpRequest) -> bytes:
    """The request's body, refused (413) past ``MAX_BODY`` whether its ``Content-Length`` says so or a chunked body
    runs on: before, only the header was checked and a chunked text/plain body (which ``app.request_body`` does not
    screen) was read whole, 100 MiB and more."""
    length = http.headers.get("content-length", "")
    chunks, size = [], int(length) if length.isdigit() else 0
    if size <= MAX_BODY:
        size = 0
        async for chunk in http.stream():
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_BODY:
                break
    if size > MAX_BODY:
        raise schema.ApiError(413, f"The body takes more than {MAX_BODY:,} bytes, the most this server takes.",
                              code="body_too_large")
    return b"".join(chunks)


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _error(exc: schema.ApiError) -> JSONResponse:
    headers = {"Retry-After": "5"} if exc.status == 429 else None  # the openai client waits that long, then retries
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)
