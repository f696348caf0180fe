"""The page with ``--backend URL``: documents, page ranges, the read's progress, streamed answers and their
TTFT / tok/s, answered by an OpenAI-compatible engine the owner runs elsewhere (``app.backend_session``).

The URL is the owner's, from the command line: no component holds it, so no visitor can point the page elsewhere.
What needs our own engine (sources, "the document may not say", exact reopen, the memory plan) is said to be
unavailable with this backend, on the page, rather than shown empty or made up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import gradio as gr

from app import escape, page_range, render
from app.backend_client import BackendClient, BackendError, BackendModel
from app.backend_session import RemoteSession
from app.documents import SUPPORTED_SUFFIXES, Document
from app.pages import join
from app.render import status
from app.sizing import read_sized

logger = logging.getLogger(__name__)

NO_CHANGE: dict = gr.update()
UNKNOWN_WINDOW = 1_000_000  # tokens: files are sized against this when the backend does not say its window
QUESTION_CHARS = 1_000_000  # the question box's limit, as the page's own (``app.asking``, which needs the engine)

# (feature, why) for each thing our engine gives that a remote backend does not.
UNAVAILABLE = (
    ("sources", "Sources (the pages an answer attended to) come from our engine's attention"),
    ("support", "“The document may not say” is read from our engine's attention over the document"),
    ("reopen", "Exact reopen of a saved read needs our engine's saved KV"),
    ("plan", "The memory plan is our engine's; the backend plans its own memory"),
)


@dataclass
class BackendTab:
    """One tab's documents (their pages, for a range) and its conversation."""

    session: RemoteSession
    documents: list[Document] = field(default_factory=list)
    pieces: list = field(default_factory=list)
    stop_requested: bool = False


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
    """The page's event functions over ``client`` (one per app; each tab has its own ``BackendTab``)."""

    def __init__(self, client: BackendClient, models: list[BackendModel]):
        self.client, self.models = client, {m.id: m for m in models}

    def tab(self, state: BackendTab | None, model: str | None) -> BackendTab:
        """The tab's state, made on first use; a model chosen anew starts a new session (its read is the old one's)."""
        chosen = model if model in self.models else next(iter(self.models))
        if state is None:
            return BackendTab(RemoteSession(self.client, chosen))
        if state.session.model != chosen:
            state.session = RemoteSession(self.client, chosen)
        return state

    def choose(self, files: list[str] | None, model: str | None, state: BackendTab | None):
        """Reads the dropped files' text (sized against the backend's window) and offers their pages as a range."""
        state = self.tab(state, model)
        window = self.models[state.session.model].max_model_len or UNKNOWN_WINDOW
        documents, problems = read_sized(files or [], window, "the backend's window")
        state.documents, state.pieces = documents, page_range.pieces_of(documents) if documents else []
        options = page_range.choices(state.pieces)
        ranged = len(state.pieces) > 1
        line = (f"{len(documents)} file(s), {sum(len(d.text) for d in documents):,} characters"
                + (f"; {len(state.pieces)} pages: choose a range or read them all" if ranged else "")
                + ("".join(f" — {p}" for p in problems)))
        return (state, gr.update(choices=options, value=0 if ranged else None, visible=ranged),
                gr.update(choices=options, value=len(options) - 1 if ranged else None, visible=ranged),
                gr.update(interactive=bool(documents)), status("warn" if problems else "info", line))

    def read(self, first: int | None, last: int | None, model: str | None,
             state: BackendTab | None) -> Iterator[tuple]:
        """Has the backend read the chosen pages (its prefix cache keeps them); the progress bar as it goes."""
        state = self.tab(state, model)
        if not state.documents:
            yield state, render.progress_bar(), status("error", "Drop files first."), NO_CHANGE
            return
        whole = join(state.documents)
        text = whole
        if state.pieces and first is not None and last is not None and (first, last) != (0, len(state.pieces) - 1):
            first, last = min(first, last), max(first, last)
            text = page_range.range_text(whole, state.pieces, first, last)
        yield (state, render.progress_bar(0, 0, state="running"),
               status("info", f"The backend is reading {len(text):,} characters…"), [])
        try:
            done = state.session.read(str(text))
        except BackendError as exc:
            logger.warning("backend read failed: %s", exc)
            yield state, render.progress_bar(0, 0, state="failed"), status("error", str(exc)), NO_CHANGE
            return
        rate = done.tokens / done.seconds if done.seconds > 0 else 0.0
        yield (state, render.progress_bar(done.tokens, done.tokens, rate, state="done"),
               status("ok", f"Read by the backend: {done.tokens:,} tokens in {render.format_seconds(done.seconds)}. "
                            "Ask away."), [])

    def ask(self, question: str, history: list[dict] | None, max_new_tokens: float, temperature: float,
            model: str | None, state: BackendTab | None) -> Iterator[tuple]:
        """Streams the backend's answer into the chat with its TTFT / tokens / tok/s line."""
        state, history, question = self.tab(state, model), list(history or []), (question or "").strip()
        if not question:
            yield state, history, NO_CHANGE, NO_CHANGE
            return
        if len(question) > QUESTION_CHARS:  # the box's limit, for a request sent past the page
            yield state, history, NO_CHANGE, status("error", f"Not asked: over {QUESTION_CHARS:,} characters.")
            return
        if not state.session.is_prefilled:
            yield state, history, NO_CHANGE, status("error", "Read documents first: drop files, then press “Read”.")
            return
        state.stop_requested = False
        history += [{"role": "user", "content": question}, {"role": "assistant", "content": "…"}]
        yield state, list(history), "", status("info", "Asking the backend…")
        try:
            for chunk in state.session.ask(question, max_new_tokens=int(max_new_tokens),
                                           temperature=float(temperature), should_stop=lambda: state.stop_requested):
                stats = render.answer_stats(chunk.ttft, chunk.num_tokens, chunk.tokens_per_second, done=chunk.done,
                                            stopped=chunk.stopped)
                history[-1] = {"role": "assistant", "content": render.answer_message(chunk.text, stats)}
                yield (state, list(history), NO_CHANGE,
                       status("ok", stats) if chunk.done else status("info", "Writing the answer…"))
        except BackendError as exc:
            logger.warning("backend answer failed: %s", exc)
            history[-1] = {"role": "assistant", "content": f"*(no answer: {escape.text(str(exc))})*"}
            yield state, list(history), NO_CHANGE, status("error", str(exc))

    @staticmethod
    def stop(state: BackendTab | None) -> None:
        if state is not None:
            state.stop_requested = True

    @staticmethod
    def new_chat(state: BackendTab | None) -> tuple:
        if state is not None:
            state.session.new_conversation()
        return state, [], status("info", "New chat. The documents stay read.")


def build_backend_ui(client: BackendClient, models: list[BackendModel], *, url: str,
                     title: str = "HeadInfer Studio") -> gr.Blocks:
    """The ``--backend`` page over ``client``, whose models are ``models`` (from its ``GET /v1/models``)."""
    page = BackendPage(client, models)
    names = [m.id for m in models]
    with gr.Blocks(title=title) as demo:
        state = gr.State(None)
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
    return demo


def _ask_events(ask: Callable, inputs: tuple, outputs: tuple, button: gr.Button, box: gr.Textbox) -> None:
    """The Ask button and Enter in the question box both ask."""
    for event in (button.click, box.submit):
        event(ask, list(inputs), list(outputs))
