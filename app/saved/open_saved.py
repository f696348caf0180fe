"""The saved documents: listed, deleted, and opened from the shelf with no upload: its text and files are kept beside its KV
(``app.saved.saved_docs.ShelfEntry``), so the documents table, the plan, the page viewer and follow-up questions all
come back. A page reload does the same for the tab's current document, with its conversation: the tab keeps
the saved document's key and the turns in the browser's ``sessionStorage`` (that tab's only; see ``app.ui``).
A handler piece of ``app.handlers.Handlers``, sharing only its ``AppState``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator

import gradio as gr

from app import escape, render, turn_notes
from app.app_state import AppState
from app.browser_state import BrowserState
from app.render import status
from app.documents import combine
from app.estimate_refresh import with_reading_time
from app.pieces import parts_read, rejoin
from app.pages import split_pages
from app.pages import tokenize
from app.sizing import token_counts
from app.views import DeleteView, OpenView, ReadView, SavedView
from engine import HeadInferError
from engine.types import RestoreStats

logger = logging.getLogger(__name__)

NO_CHANGE: dict = gr.update()
_IDLE = (gr.update(interactive=True), gr.update(interactive=False))
_READ = (gr.update(interactive=False), gr.update(interactive=False))  # reopened whole: nothing new to read


class OpenSaved:
    """The visitor's shelf of saved documents (``app.saved.shelves``): its list, deleting, reopening.

    ``read``: the read handler (``app.reading.Reading.read``), which continues a saved read cut short."""

    def __init__(self, app: AppState, *, read: Callable[..., Iterator[ReadView]]):
        self.app = app
        self._read = read

    @staticmethod
    def set_remember(remember: bool, state: BrowserState) -> None:
        """This tab's "Remember read documents on disk" checkbox: off, nothing is saved or reopened."""
        state.remember = bool(remember)

    def saved(self, request: gr.Request = None) -> SavedView:
        """The visitor's saved-documents list and the delete drop-down's choices, fresh from the disk."""
        shelf = self.app.shelves.for_request(request)
        infos, problem = shelf.list()
        choices = [(render.saved_choice_label(info), info.key) for info in infos]
        chosen = infos[0].key if len(infos) == 1 else None  # one saved document: Open opens it, no choosing
        return SavedView(render.saved_panel(infos, shelf.cap, enabled=shelf.enabled, problem=problem,
                                            leftover=shelf.leftover_bytes()),
                         gr.update(choices=choices, value=chosen))

    def delete_saved(self, key: str | None, request: gr.Request = None) -> DeleteView:
        """Deletes the chosen snapshot from the visitor's shelf; documents already loaded in any tab stay loaded."""
        deleted, sentence = self.app.shelves.for_request(request).delete(key)
        view = self.saved(request)
        return DeleteView(view.panel, view.choice, status("ok", sentence) if deleted else _warn_line(sentence))

    def open_saved(self, key: str | None, state: BrowserState, request: gr.Request = None) -> Iterator[OpenView]:
        """Reopens the chosen saved document (plan, pages, viewer, follow-ups) with no upload."""
        if not key:  # one saved document is the one meant; among several, the visitor chooses
            infos, _ = self.app.shelves.for_request(request).list()
            if len(infos) != 1:
                yield self._open_view(state, status_line=_warn_line("Choose a saved document to open first."))
                return
            key = infos[0].key
        yield from self._reopen(key, [], state, request, quiet=False)

    def resume(self, memory: str | None, state: BrowserState, request: gr.Request = None) -> Iterator[OpenView]:
        """After a reload: reopens the tab's document and its conversation (``tab_memory``'s), when it is saved."""
        try:
            remembered = json.loads(memory) if memory else {}
            key, turns = remembered.get("key"), [tuple(turn) for turn in remembered.get("turns", [])]
            notes = turn_notes.aligned(turn_notes.read_back(remembered.get("notes")), len(turns))
        except (ValueError, AttributeError, TypeError):
            key, turns, notes = None, [], []
        if not key or (state.session is not None and state.session.is_prefilled):
            yield self._open_view(state)
            return
        yield from self._reopen(key, turns, state, request, quiet=True, notes=notes)

    @staticmethod
    def tab_memory(state: BrowserState) -> str:
        """What the tab keeps across a reload: its saved document's key and the conversation (JSON)."""
        session = state.session
        if session is None or not session.is_prefilled or not state.saved_key:
            return json.dumps({})
        turns = session.conversation()  # each turn with what the chat showed beside it (``app.turn_notes``)
        return json.dumps({"key": state.saved_key, "turns": turns,
                           "notes": turn_notes.aligned(state.turn_notes, len(turns))})

    def _reopen(self, key: str, turns: list, state: BrowserState, request, *, quiet: bool,
                notes: list = ()) -> Iterator[OpenView]:
        shelf = self.app.shelves.for_request(request)
        entry = shelf.entry(key)
        if entry is None:
            line = NO_CHANGE if quiet else _warn_line(
                "This saved document cannot be opened from the list (it was saved without its text, or deleted "
                "meanwhile); drop its files to reopen it.")
            yield self._open_view(state, status_line=line)
            return
        with state.working():
            state.cancel_requested = False
            session = self.app.session(state, request)
            queue = self.app.queue
            ticket = queue.join("reopening a saved document", 2.0)
            try:
                waiting = lambda line: self._open_view(state, status_line=line)
                if not (yield from self.app.in_line(ticket, lambda: state.cancel_requested or state.is_closed, waiting)):
                    yield self._open_view(state, status_line=status("info", "You left the queue; nothing was opened."))
                    return
                yield self._open_view(state, progress=render.progress_bar(0, 1, state="reopening",
                                                                          note="reopening from disk…"),
                                      status_line=status("info", "Reopening the saved document from disk…"))
                tokens = tokenize(session, rejoin(entry.text, entry.documents))
                try:
                    session.set_document(tokens)
                except HeadInferError as exc:
                    yield self._open_view(state, status_line=_warn_line(f"Cannot reopen it here: {exc}."))
                    return
                stats = shelf.restore(session)
                if stats is None:
                    session.clear()
                    yield self._open_view(state, progress=render.progress_bar(),
                                          status_line=_warn_line("The saved copy could not be used (see the log); "
                                                                 "drop its files to read them again."))
                    return
                state.documents, state.tokens, state.read_text = list(entry.documents), tokens, entry.text
                state.pieces, state.full_tokens = [], None  # the earlier upload's pages go with it (its range offer)
                if entry.text != combine(entry.documents):  # a page range (or a beginning): its pages, not the book's
                    parts = parts_read(tokens.text, entry.documents)
                    state.documents = [doc for doc, _, _ in parts] or state.documents
                    state.token_counts = [_count(tokens, start, end, doc, session) for doc, start, end in parts]
                if len(state.token_counts) != len(state.documents):
                    state.token_counts = token_counts(tokens, state.documents, session.count_tokens)
                if not session.is_prefilled:  # a read cut short by a crash or a restart: ``continue_reading`` next
                    yield self._continuing_view(state, session, stats)
                    return
                state.saved_key = key
                session.resume_conversation(turns)
                # The chat as it was, notes and all; its turns are read again with the next question, which says so.
                state.turn_notes, state.turns_unread = list(notes) or [None] * len(turns), bool(turns)
                state.range_label = _range_label(shelf, key) if entry.text != combine(entry.documents) else None
                plan = session.document_plan()
                panel = render.plan_panel(plan, session.document_tokens, None, session.policy.kv_dtype,
                                          conversation_tokens=session.answer_budget)
                # The plan's reading time says what this open cost, as a reopen started by Read says (not "≈ –").
                panel = with_reading_time(panel, f"reopened from disk in {render.format_short_seconds(stats.seconds)}")
                bar = render.progress_bar(stats.num_tokens, stats.num_tokens, state="done", note="reopened from disk")
                names = state.range_label or ", ".join(doc.name for doc in state.documents)
                table = render.files_table(state.documents, state.token_counts, session.document_tokens,
                                           state.range_label)
                yield OpenView(state, table, panel, bar, _chat(turns, state.turn_notes, split_pages(session.document)),
                               _reopened_line(stats, names, len(turns)), *_READ,
                               pages=gr.update(choices=[], value=None, visible=False), page=render.page_view(None))
            finally:
                queue.leave(ticket)

    def open_label(self, key: str | None, request: gr.Request = None) -> dict:
        """The open button's words for the chosen saved document: "Continue reading (62%)" for a read cut short."""
        infos, _ = self.app.shelves.for_request(request).list()
        info = next((info for info in infos if info.key == key), None)
        return gr.update(value=render.continue_label(info) if info is not None and info.is_partial else "Open")

    def continue_reading(self, state: BrowserState, request: gr.Request = None) -> Iterator:
        """After ``open_saved`` restored a partial read: reads the rest (``Reading.read``, checkpointing on)."""
        session = state.session
        if session is None or session.is_prefilled or not session.prefilled_tokens or not state.read_text:
            yield ReadView(state, NO_CHANGE, NO_CHANGE, NO_CHANGE, NO_CHANGE, NO_CHANGE)
            return
        yield from self._read(False, state, request)

    @staticmethod
    def _continuing_view(state: BrowserState, session, stats: RestoreStats) -> OpenView:
        total = session.document_tokens
        left = total - stats.num_tokens
        estimate = render.format_seconds(session.read_time.estimate_prefill_seconds(total, stats.num_tokens))
        bar = render.progress_bar(stats.num_tokens, total, state="running", note="continuing…")
        line = status("info", f"Restored {stats.num_tokens:,} of {total:,} tokens read before from disk; reading the "
                              f"{left:,} left (about {estimate})…")
        plan = render.plan_panel(session.document_plan(), total, None, session.policy.kv_dtype,
                                 conversation_tokens=session.answer_budget)
        return OpenView(state, render.files_table(state.documents, state.token_counts), plan, bar, [], line,
                        gr.update(interactive=False), gr.update(interactive=True),
                        pages=gr.update(choices=[], value=None, visible=False), page=render.page_view(None))

    @staticmethod
    def _open_view(state: BrowserState, *, progress=NO_CHANGE, status_line=NO_CHANGE) -> OpenView:
        return OpenView(state, NO_CHANGE, NO_CHANGE, progress, NO_CHANGE, status_line, NO_CHANGE, NO_CHANGE)


def _count(tokens, start: int, end: int, doc, session) -> int:
    """Tokens of ``tokens.text[start:end]``, read off the one tokenization (counted again only without offsets)."""
    counted = tokens.count_between(start, end)
    return session.count_tokens(doc.text) if counted is None else counted


def _chat(turns: list, notes: list, pages: dict) -> list[dict]:
    chat = []
    for (question, answer), note in zip(turns, notes, strict=True):
        chat += [{"role": "user", "content": question},
                 {"role": "assistant", "content": turn_notes.message(answer, note, pages)}]
    return chat


def _range_label(shelf, key: str) -> str | None:
    """The page range (or beginning) a saved read holds, as its shelf entry is named ("p. 12 – p. 40 of bash.pdf")."""
    infos, _ = shelf.list()
    return next((info.label for info in infos if info.key == key), None)


def _reopened_line(stats: RestoreStats, names: str, num_turns: int) -> str:
    chat = f" with its {num_turns} earlier question{'s' if num_turns != 1 else ''}" if num_turns else ""
    seconds = render.format_short_seconds(stats.seconds)
    return status("ok", f"Reopened {names}{chat} from disk in {seconds} — no upload, no reading. Ask a question.")


def _warn_line(text: str) -> str:
    gr.Warning(escape.text(text))
    return status("error", text)
