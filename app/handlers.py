"""Event handlers: thin (generator) functions between the Gradio page and one ``DocumentSession``
per browser session.

Each handler takes the browser's :class:`BrowserState` (kept in a ``gr.State``) and returns a
named tuple from ``app.views`` whose fields match the outputs wired in ``app/ui.py``, so tests can
call the handlers directly and read ``view.plan`` instead of ``out[2]``.
"""

from __future__ import annotations

import collections
import html
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import gradio as gr

from app import render
from app.asking import Questions
from app.background import iterate_reports
from app.browser_state import BrowserState
from app.choosing import PageRanges
from app.compute_queue import ComputeQueue, Ticket
from app.documents import combine
from app.meters import meters_html
from app.opening import OpenSaved
from app.pages import last_page, split_pages
from app.render import status
from app.shelves import Shelves
from app.sizing import read_sized, token_counts
from app.uploads import delete_uploads
from app.views import ClearView, DeleteView, FilesView, ReadView, SavedView
from engine import (
    DocumentSession,
    HeadInferError,
    PlanError,
    PrefillCancelled,
    SnapshotStore,
    format_bytes,
    read_memory,
)
from engine.types import PrefillProgress, RestoreStats

logger = logging.getLogger(__name__)

NO_CHANGE: dict = gr.update()


def _warn(text: str) -> str:
    gr.Warning(html.escape(text))
    return status("error", text)


class Handlers(OpenSaved, PageRanges, Questions):
    """The page's event functions, bound to the factory that builds a session per browser."""

    def __init__(self, engine_factory: Callable[[], DocumentSession], snapshot_store: SnapshotStore | None = None, *,
                 private: bool = False, session_shelves: Path | None = None, upload_dir: Path | None = None,
                 max_question: int | None = None, compute_queue: ComputeQueue | None = None):
        """``private``: visitors are kept apart (saved documents per user or per tab, see ``app.shelves``);
        ``session_shelves``: the folder for per-tab shelves; ``upload_dir``: where Gradio keeps uploads
        (a tab's are deleted when it closes); ``max_question``: the longest question in tokens (None: what the
        plan leaves beside the document and the answer); ``compute_queue``: the line for the compute device."""
        self._factory = engine_factory
        self._max_question = max_question
        self._queue = compute_queue or ComputeQueue()
        # Seconds the last answers took, whole (question read, answer written): what a queued one is expected to take.
        self._answer_seconds: collections.deque[float] = collections.deque([20.0], maxlen=5)
        # Tokens the last answers took: how many a running answer likely has left, for those waiting behind it.
        self._answer_tokens: collections.deque[int] = collections.deque(maxlen=5)
        self._shelves = Shelves(snapshot_store, private=private, session_root=session_shelves)
        self._upload_dir = upload_dir
        # Browser session id -> its state, only so ``unload`` can free a closed tab's memory at
        # once; the handlers themselves always get their state from gr.State.
        self._open: dict[str, BrowserState] = {}

    @staticmethod
    def forget_switched(state: BrowserState) -> str | None:
        """The note of a session whose model was switched away (``engine.ModelHolder.switch``), which the
        tab then lets go of: its chosen files stay, to be read again with the new model. None: nothing to forget."""
        note = getattr(state.session, "retired", None) if state.session is not None else None
        if note:
            state.session, state.tokens, state.read_text = None, None, None  # tokens were the old tokenizer's
        return note

    def _session(self, state: BrowserState, request: gr.Request | None) -> DocumentSession:
        self.forget_switched(state)
        if state.session is None:
            state.session = self._factory()
        if request is not None and request.session_hash:
            self._open[request.session_hash] = state
        return state.session

    # -- files and plan ----------------------------------------------------------------------------
    def choose_files(self, files: list[str] | None, state: BrowserState,
                     request: gr.Request = None) -> FilesView:
        """Reads the dropped files and shows their sizes and the memory plan; runs nothing."""
        state.documents, state.token_counts, state.tokens, state.full_tokens = [], [], None, None
        state.pieces, state.range_label = [], None
        if request is not None and request.session_hash:  # so that ``unload`` finds the uploads
            self._open[request.session_hash] = state
        state.uploads.update(files or [])
        if not files:
            return FilesView(state, render.files_table([], []), render.empty_plan(),
                             gr.update(visible=False, value=False), gr.update(interactive=False), NO_CHANGE)
        session = self._session(state, request)
        # The first start's reading-cost measurement pauses meanwhile: the plan does not share the cores with it.
        with session.reading.making_a_plan():
            limits = session.limits()  # sized before reading: a file far beyond it is refused unread
            documents, problems = read_sized(files, max(limits.context_limit - session.answer_budget, 1),
                                             limits.limit_reason)
            if not documents:  # the panel still says what was dropped and why nothing can be read
                return FilesView(state, render.files_table([], []), render.refused_plan(problems),
                                 gr.update(visible=False, value=False), gr.update(interactive=False),
                                 _warn(" ".join(problems) + self._kept(state)))
            # Tokenized once: the counts, the plan, the read and the saved copy's key all use these ids.
            tokens = session.tokenize(combine(documents))
            counts = token_counts(tokens, documents, session.count_tokens)
            state.documents, state.token_counts, state.tokens, state.full_tokens = documents, counts, tokens, tokens
            try:
                plan = session.plan(tokens)
            except PlanError as exc:
                return FilesView(state, render.files_table(documents, counts), render.refused_plan([str(exc)]),
                                 gr.update(visible=False), gr.update(interactive=False), _warn(str(exc)))
            seconds = session.reading.estimate_prefill_range(min(len(tokens), plan.context_limit))
            if plan.is_within_limit:
                message = status("ok", f"Ready to read {sum(counts):,} tokens from {len(documents)} "
                                       f"file{'s' if len(documents) != 1 else ''}. Press “Read documents”.")
            else:
                message = status("warn", f"Too large: {plan.limit_reason}. Choose a page range below (or “First part "
                                         "that fits”), tick “Truncate to fit” to read the beginning only, or remove "
                                         "files.")
            if problems:
                message = _warn("Skipped: " + " ".join(problems)) + message
            panel = render.plan_panel(plan, sum(counts), seconds, session.policy.kv_dtype, _options(session, plan),
                                     conversation_tokens=session.answer_budget)
            view = FilesView(state, render.files_table(documents, counts), panel,
                             gr.update(visible=not plan.is_within_limit, value=False), gr.update(interactive=True),
                             message)
            if not plan.is_within_limit:
                state.pieces = self.pages_to_choose(state)
            return view

    def _kept(self, state: BrowserState) -> str:
        if state.session is not None and state.session.is_prefilled:
            return " The documents already read stay loaded; you can keep asking about them."
        return ""

    # -- prefill -----------------------------------------------------------------------------------
    def read(self, truncate: bool, state: BrowserState, request: gr.Request = None) -> Iterator[ReadView]:
        """Reads the chosen documents into the KV cache in chunks, reporting progress.

        With a snapshot store and the tab's "Remember" setting on, a set saved before is reopened from
        disk instead, and a set read to the end is saved for next time.
        """
        with state.working():
            state.cancel_requested = False
            if not state.documents:
                yield ReadView(state, NO_CHANGE, _warn("Drop one or more files first."), NO_CHANGE, *_IDLE)
                return
            session = self._session(state, request)
            num_tokens = len(state.tokens) if state.tokens is not None else 0
            resumed = state.tokens is not None and state.read_text == state.tokens.text  # a cancelled read goes on
            start = min(session.prefilled_tokens, num_tokens) if resumed else 0
            ticket = self._queue.join(f"reading {num_tokens:,} tokens",
                                      session.reading.estimate_prefill_seconds(max(num_tokens, 1), start))
            try:
                waiting = lambda line: ReadView(state, NO_CHANGE, line, NO_CHANGE, gr.update(interactive=False),
                                                gr.update(interactive=True))
                if not (yield from self._in_line(ticket, lambda: state.cancel_requested or state.is_closed, waiting)):
                    yield ReadView(state, NO_CHANGE, status("info", "You left the queue; nothing was read."),
                                   NO_CHANGE, *_IDLE)
                    return
                yield from self._read(truncate, state, request, ticket)
            finally:
                self._queue.leave(ticket)

    def _in_line(self, ticket: Ticket, should_leave: Callable[[], bool],
                 view: Callable[[str], object]) -> Iterator:
        """Waits for ``ticket``'s turn, yielding ``view(status line)`` with the place in line and the wait; returns
        False when the visitor left the line (``should_leave``)."""
        waiting = self._queue.wait_turn(ticket, should_leave)
        while True:
            try:
                text = next(waiting)
            except StopIteration as done:
                return done.value
            yield view(render.queue_status(self._queue.position(ticket), text))

    def _read(self, truncate: bool, state: BrowserState, request: gr.Request | None,
              ticket: Ticket) -> Iterator[ReadView]:
        idle, running = _IDLE, (gr.update(interactive=False), gr.update(interactive=True))
        session = self._session(state, request)
        tokens = state.tokens if state.tokens is not None else session.tokenize(combine(state.documents))
        text = tokens.text
        chat = plan = chips = page = NO_CHANGE
        if text != state.read_text or session.document_tokens == 0:
            try:
                session.set_document(tokens, truncate_to_fit=truncate)
            except HeadInferError as exc:  # too long, empty: anything else is a bug and surfaces
                offer = isinstance(exc, PlanError) and not truncate
                hint = " Tick “Truncate to fit” to read only the beginning." if offer else ""
                yield ReadView(state, NO_CHANGE, _warn(f"Cannot read these documents: {exc}.{hint}{self._kept(state)}"),
                               NO_CHANGE, *idle)
                return
            state.read_text, chat = text, []  # the session dropped the old document and its chat
            chips, page = _NO_CHIPS, render.page_view(None)  # ... and the old document's page chips
            state.saved_key = None
            if session.document != text:  # truncated to fit: the panel shows what is read, not the whole set
                plan = _truncated_plan(session, len(tokens))
        elif session.is_prefilled:
            yield ReadView(state, _done_bar(session), status("ok", "Already read. Ask away."), NO_CHANGE, *idle)
            return
        shelf = self._shelves.for_request(request)
        remember = shelf.enabled and state.remember
        note = ""
        # Only into an empty cache: a cancelled read that got partway resumes rather than restarts.
        if remember and session.prefilled_tokens == 0 and (saved := shelf.find(session)) is not None:
            yield ReadView(state, render.progress_bar(0, session.document_tokens, state="reopening",
                                                      note="reopening from disk…"),
                           status("info", f"Reopening the saved copy ({format_bytes(saved.num_bytes)}) from disk…"),
                           chat, *_BUSY, plan=plan, pages=chips, page=page)
            chat, stats = NO_CHANGE, shelf.restore(session)
            if stats is not None and not session.is_prefilled:  # a read cut short: it goes on from there
                note = f"Continuing the read saved at {stats.num_tokens:,} tokens. "
            elif stats is not None:
                state.saved_key = saved.key
                bar = render.progress_bar(stats.num_tokens, stats.num_tokens, state="done", note="reopened from disk")
                yield ReadView(state, bar, _reopened(stats), NO_CHANGE, *idle)
                return
            else:
                note = "The saved copy could not be used (see the log), so the documents are read instead. "
        checkpoints = shelf.checkpoints(session, _label(state, session, text), tuple(state.documents)) \
            if remember else None  # a crash or a restart mid-read loses little: the shelf continues it
        total, start = session.document_tokens, session.prefilled_tokens
        bar = render.progress_bar(session.prefilled_tokens, total, state="running")
        reading = status("info", f"{note}Reading {total:,} tokens (documents with the prompt)…")
        yield ReadView(state, bar, reading, chat, *running, plan=plan, pages=chips, page=page)
        last: PrefillProgress | None = None
        paused = False
        try:
            for item in iterate_reports(
                lambda report: session.prefill(report, lambda: state.cancel_requested,
                                               give_way=self._giving_way(ticket, state, report),
                                               checkpoints=checkpoints),
                abandon=lambda: setattr(state, "cancel_requested", True), name="prefill",
            ):
                if isinstance(item, str):  # the read gave the device to another visitor between two chunks
                    paused = True
                    # The count the bar shows: a read that gives way between layers is inside a forward, whose
                    # tokens the cache holds only once it ends (``prefilled_tokens`` said 0 beside a bar at 868).
                    done = last.tokens_done if last is not None else session.prefilled_tokens
                    yield ReadView(state, NO_CHANGE, render.queue_status(
                        self._queue.position(ticket), f"Paused after {done:,} of {total:,} tokens so that another "
                        f"visitor goes first; the read goes on from there. {item}"), NO_CHANGE, *running)
                    continue
                last = item
                bar = render.progress_bar(last.tokens_done, last.tokens_total, last.tokens_per_second,
                                          last.eta_seconds, state="running")
                if last.eta_seconds is not None:
                    self._queue.expect(ticket, last.eta_seconds)
                yield ReadView(state, bar, reading if paused else NO_CHANGE, NO_CHANGE, *running)
                paused = False
        except PrefillCancelled:
            done = session.prefilled_tokens
            head = tokens.head(done) if tokens.text == session.document else None
            where = last_page(head) if head else None
            stopped = f" It stopped in {where}." if where else ""
            yield ReadView(state, render.progress_bar(done, total, state="cancelled", note="cancelled"),
                           status("warn", f"Cancelled after {done:,} of {total:,} tokens.{stopped} Press “Read "
                                          "documents” to continue from there."), NO_CHANGE, *idle)
            return
        except MemoryError as exc:
            logger.warning("prefill ran out of memory: %s", exc)
            yield ReadView(state, render.progress_bar(session.prefilled_tokens, total, state="failed",
                                                      note="out of memory"),
                           _warn(f"{exc}. What was read so far is kept: “Read documents” continues from there."),
                           NO_CHANGE, *idle)
            return
        seconds = f" in {render.format_seconds(last.elapsed)} ({last.tokens_per_second:,.0f} tok/s)" if last else ""
        # This run's own tokens: a read resumed after a cancel reads only the rest.
        finished = f"Read {total - start:,} tokens{seconds}" + (f", the rest of {total:,}." if start else ".")
        if session.document != text and (where := last_page(session.document)):  # truncated to fit
            finished += f" It stopped in {where}: the pages after it were not read."
        elif state.range_label:
            finished += f" Read {state.range_label}."
        kind = "ok"
        if remember:
            yield ReadView(state, _done_bar(session, last), status("info", f"{finished} Saving it for instant "
                                                                           "reopening…"), NO_CHANGE, *_BUSY)
            kind, sentence = shelf.save(session, _label(state, session, text), tuple(state.documents))
            if kind == "ok":
                state.saved_key = session.snapshot_identity().key
            if kind == "error":
                gr.Warning(html.escape(sentence))
            finished += " " + sentence
        yield ReadView(state, _done_bar(session, last), status("ok" if kind == "ok" else "warn",
                                                               f"{finished} Ask a question."), NO_CHANGE, *idle)

    def _giving_way(self, ticket: Ticket, state: BrowserState, report: Callable[[object], None]) -> Callable[[], None]:
        """What a read does between its chunks: when other visitors wait, it gives them the device (the line's
        ``give_way``) and tells its tab so (``report(sentence)``); leaving the line while paused cancels the read."""
        piece_started = [time.monotonic()]

        def give_way() -> None:
            if not self._queue.give_way(ticket, lambda: state.cancel_requested or state.is_closed, report,
                                        time.monotonic() - piece_started[0]):
                state.cancel_requested = True  # out of the line: not one more chunk
            piece_started[0] = time.monotonic()

        return give_way

    @staticmethod
    def cancel(state: BrowserState) -> None:
        state.cancel_requested = True

    @staticmethod
    def show_page(page: str | None, state: BrowserState) -> str:
        """The page viewer: the text of the chosen page of the read documents (its printed label, its PDF page
        as a tooltip)."""
        session = state.session
        if page is None or session is None or not session.document:
            return render.page_view(None)
        found = split_pages(session.document).get(str(page))
        if found is None:
            return render.page_view(str(page))
        return render.page_view(str(page), found.name, found.text, found.sequence)

    @staticmethod
    def stop(state: BrowserState) -> None:
        state.stop_requested = True

    @staticmethod
    def new_chat(state: BrowserState) -> tuple[list, str]:
        if not state.wait_idle():
            return NO_CHANGE, _warn("Still stopping the answer; press “New chat” again in a moment.")
        if state.session is not None:
            state.session.new_conversation()
        return [], status("info", "New chat. The documents stay read.")

    # -- saved documents -------------------------------------------------------------------------------
    @staticmethod
    def set_remember(remember: bool, state: BrowserState) -> None:
        """This tab's "Remember read documents on disk" checkbox: off, nothing is saved or reopened."""
        state.remember = bool(remember)

    def saved(self, request: gr.Request = None) -> SavedView:
        """The visitor's saved-documents list and the delete drop-down's choices, fresh from the disk."""
        shelf = self._shelves.for_request(request)
        infos, problem = shelf.list()
        choices = [(render.saved_choice_label(info), info.key) for info in infos]
        chosen = infos[0].key if len(infos) == 1 else None  # one saved document: Open opens it, no choosing
        return SavedView(render.saved_panel(infos, shelf.cap, enabled=shelf.enabled, problem=problem,
                                            leftover=shelf.leftover_bytes()),
                         gr.update(choices=choices, value=chosen))

    def delete_saved(self, key: str | None, request: gr.Request = None) -> DeleteView:
        """Deletes the chosen snapshot from the visitor's shelf; documents already loaded in any tab stay loaded."""
        deleted, sentence = self._shelves.for_request(request).delete(key)
        view = self.saved(request)
        return DeleteView(view.panel, view.choice, status("ok", sentence) if deleted else _warn(sentence))

    # -- memory --------------------------------------------------------------------------------------
    @staticmethod
    def clear(state: BrowserState) -> ClearView:
        """Drops the documents and frees their KV cache."""
        if not state.wait_idle():
            return ClearView(state, NO_CHANGE, NO_CHANGE, NO_CHANGE, NO_CHANGE, NO_CHANGE, NO_CHANGE,
                             _warn("Still stopping the running work; press “Clear documents” again in a moment."))
        state.close()
        state.documents, state.token_counts, state.tokens = [], [], None
        return ClearView(state, None, render.files_table([], []), render.empty_plan(),
                         gr.update(visible=False, value=False),
                         render.progress_bar(), [], status("info", "Documents cleared; their memory is freed."))

    @staticmethod
    def meters(state: BrowserState | None) -> str:
        session = state.session if state is not None else None
        return meters_html(read_memory(), session.memory() if session is not None else None)

    def unload(self, request: gr.Request) -> None:
        """The tab closed: free its document now rather than when Gradio expires the state, and delete
        its uploaded files and (for a visitor kept apart without a login) its saved documents."""
        if request is None or not request.session_hash:
            return
        self._shelves.close_session(request.session_hash)
        state = self._open.pop(request.session_hash, None)
        if state is None:
            return
        if self._upload_dir is not None:
            delete_uploads(state.uploads, self._upload_dir)
        state.is_closed = state.cancel_requested = state.stop_requested = True
        if not state.is_busy:  # otherwise ``working`` frees it when the running event ends
            state.close()
        logger.info("browser session closed; its document memory and uploads are freed")


_BUSY = (gr.update(interactive=False), gr.update(interactive=False))  # disk work: nothing to cancel
_IDLE = (gr.update(interactive=True), gr.update(interactive=False))  # read button on, cancel off
_NO_CHIPS = gr.update(choices=[], value=None, visible=False)  # a new document: the old one's page chips go


def _reopened(stats: RestoreStats) -> str:
    rate = stats.gb_per_second
    bandwidth = f"{rate:.1f} GB/s" if rate >= 1 else f"{rate * 1000:.0f} MB/s"
    seconds = f"{stats.seconds:.2f} s" if stats.seconds < 1 else render.format_seconds(stats.seconds)  # often < 0.1 s
    return status("ok", f"Reopened from disk in {seconds} ({bandwidth}) — no reading needed. Ask a question.")


def _label(state: BrowserState, session: DocumentSession, text: str) -> str:
    """The saved-documents name of a set: its file names, or the page range read, marked when only the beginning
    was read."""
    names = state.range_label or ", ".join(doc.name for doc in state.documents)
    return names + " (beginning)" if session.document != text else names


def _done_bar(session: DocumentSession, last: PrefillProgress | None = None) -> str:
    total = session.document_tokens
    rate = last.tokens_per_second if last else 0.0
    return render.progress_bar(total, total, rate, state="done", note="done")


def _truncated_plan(session: DocumentSession, num_chosen: int) -> str:
    """The plan panel of the beginning that was read, out of ``num_chosen`` tokens."""
    plan = session.document_plan()
    seconds = session.reading.estimate_prefill_range(session.document_tokens)
    return render.plan_panel(plan, session.document_tokens, seconds, session.policy.kv_dtype,
                             _options(session, plan), truncated_from=num_chosen, stopped_in=last_page(session.document),
                             conversation_tokens=session.answer_budget)


def _options(session: DocumentSession, plan) -> list:
    """Capacity options, shown when memory is what binds the context (not the model's window or a setting)."""
    if plan.limited_by != "memory" or not hasattr(session, "capacity_options"):
        return []
    return session.capacity_options()
