"""The page with ``--backend URL``: documents, page ranges, the read's progress, streamed answers and their
TTFT / tok/s, answered by an OpenAI-compatible engine the owner runs elsewhere (``app.backend_session``).

The URL is the owner's, from the command line: no component holds it, so no visitor can point the page elsewhere.
What needs our own engine (sources, "the document may not say", exact reopen, the memory plan) is said to be
unavailable with this backend, on the page, rather than shown empty or made up.

Shared (``--share``, logins), it keeps the page's own guarantees with the page's own parts: each tab's state answers
only the login and browser that first used it (``app.tab_owner``, ``app.browser_id``), so another visitor who sends
its session hash can neither continue, read back nor stop its conversation; reads and questions take the visitor caps
(``app.visitor_caps``) and then wait in one line (``app.compute_queue``), so one visitor cannot flood the owner's
backend; a closed tab leaves the line and lets go of its documents.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import urlsplit

import gradio as gr

from app import escape, pieces, render
from app.backend_client import BackendClient, BackendError, BackendModel
from app.backend_session import RemoteSession
from app.browser_state import BrowserState
from app.compute_queue import ComputeQueue, Ticket
from app.documents import SUPPORTED_SUFFIXES
from app.pages import join
from app.render import status
from app.sizing import read_sized
from app.tab_owner import is_owner, owned
from app.visitor_caps import NO_CAPS, CapLimits, CapReached, VisitorCaps
from app.answer_record import AnswerRecord

logger = logging.getLogger(__name__)

NO_CHANGE: dict = gr.update()
UNKNOWN_WINDOW = 1_000_000  # tokens: files are sized against this when the backend does not say its window
QUESTION_CHARS = 1_000_000  # the question box's limit, as the page's own (``app.questions``, which needs the engine)
READ_CHARS_PER_SECOND = 20_000.0  # a read's expected pace in line until the backend has read once here

# (feature, why) for each thing our engine gives that a remote backend does not.
UNAVAILABLE = (
    ("sources", "Sources (the pages an answer attended to) come from our engine's attention"),
    ("support", "“The document may not say” is read from our engine's attention over the document"),
    ("reopen", "Exact reopen of a saved read needs our engine's saved KV"),
    ("plan", "The memory plan is our engine's; the backend plans its own memory"),
)


@dataclass
class BackendTab(BrowserState):
    """One tab's documents (their pages, for a range) and its conversation (``session``: a ``RemoteSession``), with
    what the page's own tabs have: the owner binding, the busy / stop / closed flags, the uploads, and ``read_text``
    (what the visitor caps count as a document held)."""

    owned_by_browser: ClassVar[bool] = True  # bound to the login and the browser's id (``app.tab_owner``)


def shown_address(url: str) -> str:
    """``scheme://host:port/path`` without any user name or password the URL carries."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def unavailable_html() -> str:
    """The list of what this backend cannot give, each marked ``data-unavailable``."""
    items = "".join(f'<li data-unavailable="{escape.attr(key)}">{escape.text(why)}: '
                    '<strong>unavailable with this backend</strong>.</li>' for key, why in UNAVAILABLE)
    return ('<div class="backend-unavailable"><p>Each question sends the documents again as the prompt\'s start; the '
            "backend's prefix cache (vLLM's automatic prefix caching, SGLang's RadixAttention, llama.cpp's slots) "
            f"reuses what it still holds instead of reading it again.</p><ul>{items}</ul></div>")


class BackendPage:
    """The page's event functions over ``client`` (one per app; each tab has its own ``BackendTab``). ``caps``: the
    visitor caps (``NO_CAPS``: the owner alone); ``queue``: the line the backend's requests wait in."""

    def __init__(self, client: BackendClient, models: list[BackendModel], *, caps: CapLimits | None = None,
                 queue: ComputeQueue | None = None):
        self.client, self.models = client, {m.id: m for m in models}
        self.caps, self.queue = VisitorCaps(caps or CapLimits()), queue or ComputeQueue()
        self.answers, self.read_pace = AnswerRecord(), READ_CHARS_PER_SECOND
        self.tabs: dict[str, BackendTab] = {}  # session hash -> its state, so a closed tab is let go at once
        # Every event that takes a tab's state refuses another login or browser than the tab's (``app.tab_owner``).
        for name in ("choose", "read", "ask", "stop", "new_chat"):
            setattr(self, name, owned(getattr(self, name)))

    def tab(self, state: BackendTab | None, model: str | None, request: gr.Request | None = None) -> BackendTab:
        """The tab's state, its session made on first use; a model chosen anew starts a new session (the documents
        stay chosen, to be read by it)."""
        chosen = model if model in self.models else next(iter(self.models))
        state = state if state is not None else BackendTab()
        if state.session is None or state.session.model != chosen:
            state.session, state.read_text = RemoteSession(self.client, chosen), None
        if request is not None and getattr(request, "session_hash", None):
            self.tabs[request.session_hash] = state
        return state

    def choose(self, files: list[str] | None, model: str | None, state: BackendTab | None,
               request: gr.Request = None):
        """Reads the dropped files' text (sized against the backend's window) and offers their pages as a range."""
        state = self.tab(state, model, request)
        try:
            self.caps.choose_files(state, request, files or [])  # the bytes a visitor's tabs hold, as on the page
        except CapReached as exc:
            state.documents, state.pieces = [], []
            hidden = gr.update(choices=[], value=None, visible=False)
            return state, hidden, hidden, gr.update(interactive=False), status("warn", f"Not taken: {exc}.")
        state.uploads.update(files or [])
        window = self.models[state.session.model].max_model_len or UNKNOWN_WINDOW
        documents, problems = read_sized(files or [], window, "the backend's window")
        state.documents, state.pieces = documents, pieces.pieces_of(documents) if documents else []
        options = pieces.choices(state.pieces)
        ranged = len(state.pieces) > 1
        line = (f"{len(documents)} file(s), {sum(len(d.text) for d in documents):,} characters"
                + (f"; {len(state.pieces)} pages: choose a range or read them all" if ranged else "")
                + ("".join(f" — {p}" for p in problems)))
        return (state, gr.update(choices=options, value=0 if ranged else None, visible=ranged),
                gr.update(choices=options, value=len(options) - 1 if ranged else None, visible=ranged),
                gr.update(interactive=bool(documents)), status("warn" if problems else "info", line))

    def read(self, first: int | None, last: int | None, model: str | None, state: BackendTab | None,
             request: gr.Request = None) -> Iterator[tuple]:
        """Has the backend read the chosen pages (its prefix cache keeps them), once at the front of the line; the
        progress bar."""
        state = self.tab(state, model, request)
        if not state.documents:
            yield state, render.progress_bar(), status("error", "Drop files first."), NO_CHANGE
            return
        try:
            held = self.caps.take("read", state, request)
        except CapReached as exc:  # a visitor at a cap: refused at once, saying which
            yield state, render.progress_bar(), status("warn", f"Not read: {exc}."), NO_CHANGE
            return
        with held, state.working():
            yield from self._read(first, last, state)

    def _read(self, first: int | None, last: int | None, state: BackendTab) -> Iterator[tuple]:
        whole = join(state.documents)
        text = whole
        if state.pieces and first is not None and last is not None and (first, last) != (0, len(state.pieces) - 1):
            first, last = min(first, last), max(first, last)
            text = pieces.range_text(whole, state.pieces, first, last)
        text, state.stop_requested, state.read_text = str(text), False, None
        running = render.progress_bar(0, 0, state="running")
        ticket = self.queue.join(f"reading {len(text):,} characters", len(text) / self.read_pace)
        try:
            if not (yield from self._wait_front(ticket, state, lambda line: (state, running, line, NO_CHANGE))):
                yield state, render.progress_bar(), status("info", "You left the queue; nothing was read."), NO_CHANGE
                return
            yield state, running, status("info", f"The backend is reading {len(text):,} characters…"), []
            try:
                done = state.session.read(text)
            except BackendError as exc:
                logger.warning("backend read failed: %s", exc)
                yield state, render.progress_bar(0, 0, state="failed"), status("error", str(exc)), NO_CHANGE
                return
        finally:
            self.queue.leave(ticket)
        state.read_text = text
        if done.seconds > 0:
            self.read_pace = max(len(text) / done.seconds, 1.0)
        rate = done.tokens / done.seconds if done.seconds > 0 else 0.0
        yield (state, render.progress_bar(done.tokens, done.tokens, rate, state="done"),
               status("ok", f"Read by the backend: {done.tokens:,} tokens in {render.format_seconds(done.seconds)}. "
                            "Ask away."), [])

    def ask(self, question: str, history: list[dict] | None, max_new_tokens: float, temperature: float,
            model: str | None, state: BackendTab | None, request: gr.Request = None) -> Iterator[tuple]:
        """Streams the backend's answer into the chat, once at the front of the line, with its TTFT / tokens / tok/s
        line."""
        state, history, question = self.tab(state, model, request), list(history or []), (question or "").strip()
        if not question:
            yield state, history, NO_CHANGE, NO_CHANGE
            return
        if len(question) > QUESTION_CHARS:  # the box's limit, for a request sent past the page
            yield state, history, NO_CHANGE, status("error", f"Not asked: over {QUESTION_CHARS:,} characters.")
            return
        if not state.session.is_prefilled:
            yield state, history, NO_CHANGE, status("error", "Read documents first: drop files, then press “Read”.")
            return
        try:
            held = self.caps.take("question", state, request)
        except CapReached as exc:
            yield state, history, NO_CHANGE, status("warn", f"Not asked: {exc}.")
            return
        with held, state.working():
            yield from self._ask(question, history, int(max_new_tokens), float(temperature), state)

    def _ask(self, question: str, history: list[dict], max_new_tokens: int, temperature: float,
             state: BackendTab) -> Iterator[tuple]:
        state.stop_requested = False
        history += [{"role": "user", "content": question}, {"role": "assistant", "content": "…"}]
        ticket = self.queue.join("answering a question", self.answers.expected_seconds(max_new_tokens))
        try:
            if not (yield from self._wait_front(ticket, state, lambda line: (state, list(history), "", line))):
                history[-1] = {"role": "assistant", "content": "*(left the queue before an answer)*"}
                yield state, list(history), NO_CHANGE, status("info", "You left the queue; nothing was asked.")
                return
            yield state, list(history), "", status("info", "Asking the backend…")
            for chunk in state.session.ask(question, max_new_tokens=max_new_tokens, temperature=temperature,
                                           should_stop=lambda: state.stop_requested or state.is_closed):
                stats = render.answer_stats(chunk.ttft, chunk.num_tokens, chunk.tokens_per_second, done=chunk.done,
                                            stopped=chunk.stopped)
                history[-1] = {"role": "assistant", "content": render.answer_message(chunk.text, stats)}
                if chunk.done and not chunk.stopped:
                    self.answers.record(chunk.num_tokens, chunk.tokens_per_second, 0.0,
                                        time.monotonic() - ticket.started if ticket.started else 0.0)
                yield (state, list(history), NO_CHANGE,
                       status("ok", stats) if chunk.done else status("info", "Writing the answer…"))
        except BackendError as exc:  # said as text (escaped), never the backend's markup
            logger.warning("backend answer failed: %s", exc)
            said = render.model_markdown(escape.text(str(exc)))
            history[-1] = {"role": "assistant", "content": f"*(no answer: {said})*"}
            yield state, list(history), NO_CHANGE, status("error", str(exc))
        finally:
            self.queue.leave(ticket)

    def _wait_front(self, ticket: Ticket, state: BackendTab, view: Callable[[str], tuple]) -> Iterator[tuple]:
        """Waits for ``ticket`` to reach the front of the line, yielding ``view(the line's status)``; False when the
        tab pressed Stop or closed first (then it has left the line)."""
        return (yield from self.queue.in_line(ticket, lambda: state.stop_requested or state.is_closed, view))

    def stop(self, state: BackendTab | None) -> None:
        """Stops the tab's answer, or takes its question or read out of the line."""
        if state is not None:
            state.stop_requested = True

    def new_chat(self, state: BackendTab | None) -> tuple:
        if state is not None and state.session is not None:
            state.session.new_conversation()
        return state, [], status("info", "New chat. The documents stay read.")

    def unload(self, request: gr.Request) -> None:
        """The tab closed: out of the line, its answer stopped and its documents let go (at once, not when Gradio
        expires its state); another login's or browser's unload of it is ignored."""
        session_hash = getattr(request, "session_hash", None)
        state = self.tabs.get(session_hash) if session_hash else None
        if state is None:
            return
        if not is_owner(state, request):  # /heartbeat/{hash} needs no login: not the tab's own
            logger.warning("a backend tab's unload from another login or browser than the tab's was ignored")
            return
        self.tabs.pop(session_hash, None)
        self.caps.tab_closed(session_hash, getattr(request, "username", None))
        state.is_closed = state.stop_requested = True
        if not state.is_busy:  # otherwise ``working`` lets go of it when the running event ends
            state.close()


def build_backend_ui(client: BackendClient, models: list[BackendModel], *, url: str,
                     title: str = "HeadInfer Studio", private: bool = True, caps: CapLimits | None = None,
                     queue: ComputeQueue | None = None) -> gr.Blocks:
    """The ``--backend`` page over ``client``, whose models are ``models`` (from its ``GET /v1/models``).
    ``private``: others may reach the app, so the visitor caps hold (``caps``, None: their defaults); False: the
    owner alone, no caps. The page's ``BackendPage`` is ``demo.backend_page``."""
    page = BackendPage(client, models, caps=(caps or CapLimits()) if private else NO_CAPS, queue=queue)
    names = [m.id for m in models]
    with gr.Blocks(title=title) as demo:
        state = gr.State(BackendTab(), delete_callback=lambda s: s.close() if s else None)
        gr.HTML(f'<div id="backend-header" data-backend="{escape.attr(shown_address(url))}"><h2>{escape.text(title)}'
                f"</h2><p>Answering through the backend at <code>{escape.text(shown_address(url))}</code> "
                "(set by the app's owner).</p></div>")
        with gr.Row():
            with gr.Column(scale=4):
                model = gr.Dropdown(names, value=names[0], label="Backend model", elem_id="backend-model")
                files = gr.File(label="Documents", file_count="multiple", file_types=list(SUPPORTED_SUFFIXES),
                                elem_id="file-drop", height=120)
                with gr.Row():
                    first = gr.Dropdown([], value=None, label="From page", visible=False, elem_id="range-from")
                    last = gr.Dropdown([], value=None, label="To page", visible=False, elem_id="range-to")
                read = gr.Button("Read documents", variant="primary", interactive=False, elem_id="read")
                progress = gr.HTML(render.progress_bar(), elem_id="prefill-progress")
                gr.HTML(unavailable_html(), label="With this backend", elem_id="backend-unavailable")
            with gr.Column(scale=6):
                chat = gr.Chatbot(label="Questions and answers", elem_id="chat", height=440, layout="bubble")
                with gr.Row():
                    question = gr.Textbox(show_label=False, placeholder="Ask about the documents…", scale=6,
                                          elem_id="question", lines=1, max_lines=4, max_length=QUESTION_CHARS)
                    ask = gr.Button("Ask", variant="primary", scale=1, elem_id="ask")
                    stop = gr.Button("Stop", scale=1, elem_id="stop")
                new_chat = gr.Button("New chat", size="sm", elem_id="new-chat")
                line = gr.HTML(status("info", "Drop files to begin."), elem_id="status")
                with gr.Accordion("Answer settings", open=False):
                    max_tokens = gr.Slider(8, 4096, value=512, step=8, label="Longest answer (tokens)",
                                           elem_id="max-tokens")
                    temperature = gr.Slider(0.0, 1.5, value=0.0, step=0.05, label="Temperature")
        files.change(page.choose, [files, model, state], [state, first, last, read, line])
        read.click(page.read, [first, last, model, state], [state, progress, line, chat])
        _ask_events(page.ask, (question, chat, max_tokens, temperature, model, state), (state, chat, question, line),
                    ask, question)
        stop.click(page.stop, [state], None, queue=False)
        new_chat.click(page.new_chat, [state], [state, chat, line])
        demo.unload(page.unload)
    demo.backend_page = page
    return demo


def _ask_events(ask: Callable, inputs: tuple, outputs: tuple, button: gr.Button, box: gr.Textbox) -> None:
    """The Ask button and Enter in the question box both ask."""
    for event in (button.click, box.submit):
        event(ask, list(inputs), list(outputs))
