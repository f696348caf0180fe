"""Choosing files and reading them: the plan before anything runs, then the read into the KV cache in chunks, in the
device's line and giving way between chunks, reopened from the shelf instead when it was saved (a handler piece of
``app.handlers.Handlers``, sharing only its ``AppState``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import gradio as gr

from app import escape, render
from app.app_state import AppState
from app.background import iterate_reports
from app.browser_state import BrowserState
from app.page_ranges import PageRanges
from app.compute_queue import Ticket
from app.estimate_refresh import READING_NOW, with_reading_time
from app.pages import join, last_page, read_part, tokenize
from app.read_offer import read_button
from app.render import status
from app.saved.saved_docs import SavedDocs
from app.sizing import read_sized, token_counts
from app.uploads import delete_uploads
from app.views import FilesView, ReadView
from app.visitor_caps import CapReached
from byte_units import format_bytes, format_rate
from engine import DocumentSession, HeadInferError, PlanError, PrefillCancelled
from engine.types import DocumentTokens, PrefillProgress, RestoreStats, SnapshotInfo

logger = logging.getLogger(__name__)

NO_CHANGE: dict = gr.update()
_BUSY = (gr.update(interactive=False), gr.update(interactive=False))  # disk work: nothing to cancel
_RUNNING = (gr.update(interactive=False), gr.update(interactive=True))  # reading: cancel on
_NO_CHIPS = gr.update(choices=[], value=None, visible=False)  # a new document: the old one's page chips go


class _Fresh(NamedTuple):
    """What taking a new document changes on the page, sent with the read's first view: the chat emptied, the old
    document's page chips and viewer gone (each unchanged otherwise)."""

    chat: Any = NO_CHANGE
    pages: Any = NO_CHANGE
    page: Any = NO_CHANGE


class Reading:
    """The tab's documents: chosen (sized, tokenized once, planned) and read (or reopened from the shelf)."""

    def __init__(self, app: AppState):
        self.app = app

    def choose_files(self, files: list[str] | None, state: BrowserState,
                     request: gr.Request = None) -> FilesView:
        """Reads the dropped files and shows their sizes and the memory plan; runs nothing."""
        state.documents, state.token_counts, state.tokens, state.full_tokens = [], [], None, None
        state.pieces, state.range_label = [], None
        self.app.remember_tab(state, request)  # so that ``unload`` finds the uploads
        try:
            self.app.caps.choose_files(state, request, files or [])
        except CapReached as exc:  # refused whole: its new files go at once, none of them is read
            if self.app.upload_dir is not None:
                delete_uploads(set(files or []) - state.uploads, self.app.upload_dir)
            return FilesView(state, render.files_table([], []), render.refused_plan([str(exc)]),
                             gr.update(visible=False, value=False), read_button(state, False),
                             _warn(f"Not taken: {exc}."))
        state.uploads.update(files or [])
        if not files:  # the last file removed: what was said of the set goes with it
            return FilesView(state, render.files_table([], []), render.empty_plan(),
                             gr.update(visible=False, value=False), read_button(state, False),
                             status("info", "No files chosen." + _kept(state)))
        session = self.app.session(state, request)
        # The first start's reading-cost measurement pauses meanwhile: the plan does not share the cores with it.
        with session.read_time.making_a_plan():
            limits = session.limits()  # sized before reading: a file far beyond it is refused unread
            documents, problems = read_sized(files, max(session.document_limit(limits), 1),
                                             limits.limit_reason)
            if not documents:  # the panel still says what was dropped and why nothing can be read
                return FilesView(state, render.files_table([], []), render.refused_plan(problems),
                                 gr.update(visible=False, value=False), read_button(state, False),
                                 _warn(" ".join(problems) + _kept(state)))
            # Tokenized once: the counts, the plan, the read and the saved copy's key all use these ids.
            tokens = tokenize(session, join(documents))
            counts = token_counts(tokens, documents, session.count_tokens)
            state.documents, state.token_counts, state.tokens, state.full_tokens = documents, counts, tokens, tokens
            try:
                plan = session.plan(tokens)
            except PlanError as exc:
                return FilesView(state, render.files_table(documents, counts, len(tokens)), render.refused_plan([str(exc)]),
                                 gr.update(visible=False), read_button(state, False), _warn(str(exc)))
            share = max(session.document_limit(plan), 1)  # what “Truncate to fit” reads of a set over it
            seconds = session.read_time.estimate_prefill_range(min(len(tokens), share))
            if plan.is_within_limit:
                message = status("ok", f"Ready to read {len(tokens):,} tokens (with the prompt) from {len(documents)} "
                                       f"file{'s' if len(documents) != 1 else ''}. Press “Read documents”.")
            else:
                message = status("warn", f"Too large: {plan.limit_reason}. Choose a page range below (or “First part "
                                         "that fits”), tick “Truncate to fit” to read the beginning only, or remove "
                                         "files.")
            if problems:
                message = _warn("Skipped: " + " ".join(problems)) + message
            panel = render.plan_panel(plan, len(tokens), seconds, session.policy.kv_dtype, _options(session, plan),
                                     conversation_tokens=session.answer_budget,
                                     weights=getattr(session, "weights", None))  # (the tests' fakes: none)
            read = tokens.text == state.read_text and session.is_prefilled  # the set read already: nothing new
            if read:
                message = status("ok", f"Already read ({len(tokens):,} tokens with the prompt). Ask away.")
            view = FilesView(state, render.files_table(documents, counts, len(tokens)), panel,
                             gr.update(visible=not plan.is_within_limit, value=False),
                             read_button(state, False), message)
            if not plan.is_within_limit:
                state.pieces = PageRanges.pages_to_choose(state)
            return view

    # -- prefill -----------------------------------------------------------------------------------
    def read(self, truncate: bool, state: BrowserState, request: gr.Request = None) -> Iterator[ReadView]:
        """Reads the chosen documents into the KV cache in chunks, reporting progress.

        With a snapshot store and the tab's "Remember" setting on, a set saved before is reopened from
        disk instead, and a set read to the end is saved for next time.
        """
        try:
            held = self.app.caps.take("read", state, request)
        except CapReached as exc:
            yield ReadView(state, NO_CHANGE, _warn(f"Not read: {exc}."), NO_CHANGE, *_idle(state, truncate))
            return
        with held, state.working():
            state.cancel_requested = False
            if not state.documents:
                yield ReadView(state, NO_CHANGE, _warn("Drop one or more files first."), NO_CHANGE,
                               *_idle(state, truncate))
                return
            session = self.app.session(state, request)
            num_tokens = len(state.tokens) if state.tokens is not None else 0
            resumed = state.tokens is not None and state.read_text == state.tokens.text  # a cancelled read goes on
            start = min(session.prefilled_tokens, num_tokens) if resumed else 0
            queue = self.app.queue
            ticket = queue.join(f"reading {num_tokens:,} tokens",
                                session.read_time.estimate_prefill_seconds(max(num_tokens, 1), start))
            try:
                waiting = lambda line: ReadView(state, NO_CHANGE, line, NO_CHANGE, *_RUNNING)
                if not (yield from self.app.in_line(ticket, lambda: state.cancel_requested or state.is_closed,
                                                    waiting)):
                    yield ReadView(state, NO_CHANGE, status("info", "You left the queue; nothing was read."),
                                   NO_CHANGE, *_idle(state, truncate))
                    return
                yield from self._read(truncate, state, request, ticket)
            finally:
                queue.leave(ticket)

    def _read(self, truncate: bool, state: BrowserState, request: gr.Request | None,
              ticket: Ticket) -> Iterator[ReadView]:
        """The read, at the front of the line: take the document, reopen its saved copy or read it, then save it."""
        session = self.app.session(state, request)
        tokens = state.tokens if state.tokens is not None else tokenize(session, join(state.documents))
        fresh = yield from self._take(session, tokens, truncate, state)
        if fresh is None:  # refused, or read already
            return
        shelf = self.app.shelves.for_request(request)
        remember = shelf.enabled and state.remember
        note = ""
        # Only into an empty cache: a cancelled read that got partway resumes rather than restarts.
        if remember and session.prefilled_tokens == 0 and (saved := shelf.find(session)) is not None:
            note = yield from self._reopen(session, shelf, saved, state, fresh, len(tokens))
            if note is None:  # reopened whole: nothing to read
                return
            fresh = fresh._replace(chat=NO_CHANGE)  # the reopening view emptied it
        checkpoints = shelf.checkpoints(session, _label(state, session, tokens.text), tuple(state.documents)) \
            if remember else None  # a crash or a restart mid-read loses little: the shelf continues it
        total, start = session.document_tokens, session.prefilled_tokens
        reading = status("info", f"{note}Reading {total:,} tokens (documents with the prompt)…")
        # One estimate on the screen while the read runs: the bar's countdown, measured from its chunks.
        yield ReadView(state, render.progress_bar(start, total, state="running"), reading, fresh.chat, *_RUNNING,
                       plan=_panel(session, len(tokens), READING_NOW), pages=fresh.pages, page=fresh.page)
        read_whole, last = yield from self._prefill(session, tokens, truncate, state, ticket, checkpoints, reading)
        if read_whole:
            yield from self._finish(session, tokens, state, shelf if remember else None, start, last)

    def _take(self, session: DocumentSession, tokens: DocumentTokens, truncate: bool,
              state: BrowserState) -> Iterator[ReadView]:
        """Makes ``tokens`` the session's document unless it is already; returns what that changes on the page, or
        None (after saying why) when it is refused or read already."""
        if tokens.text == state.read_text and session.document_tokens != 0:
            if session.is_prefilled:
                yield ReadView(state, _done_bar(session), status("ok", "Already read. Ask away."), NO_CHANGE,
                               *_idle(state, False))
                return None
            return _Fresh()  # a read cancelled part-way: it goes on
        try:
            session.set_document(tokens, truncate_to_fit=truncate)
        except HeadInferError as exc:  # too long, empty: anything else is a bug and surfaces
            offer = isinstance(exc, PlanError) and not truncate
            hint = " Tick “Truncate to fit” to read only the beginning." if offer else ""
            yield ReadView(state, NO_CHANGE, _warn(f"Cannot read these documents: {exc}.{hint}{_kept(state)}"),
                           NO_CHANGE, *_idle(state, truncate))
            return None
        # A read truncated to fit keeps where its files and pages lie (the chips, the viewer and "stopped in").
        session.document = read_part(session.document, tokens.text)
        state.read_text, state.saved_key = tokens.text, None
        # The session dropped the old document and its chat, and with them the old document's page chips.
        return _Fresh([], _NO_CHIPS, render.page_view(None))

    def _reopen(self, session: DocumentSession, shelf: SavedDocs, saved: SnapshotInfo, state: BrowserState,
                fresh: _Fresh, num_chosen: int) -> Iterator[ReadView]:
        """Fills the cache from the saved copy; returns None when that read it whole, else the sentence the read
        that follows begins with (it continues a saved read cut short, or the copy could not be used)."""
        yield ReadView(state, render.progress_bar(0, session.document_tokens, state="reopening",
                                                  note="reopening from disk…"),
                       status("info", f"Reopening the saved copy ({format_bytes(saved.num_bytes)}) from disk…"),
                       fresh.chat, *_BUSY, plan=_panel(session, num_chosen, "reopening from disk…"),
                       pages=fresh.pages, page=fresh.page)
        stats = shelf.restore(session)
        if stats is None:
            return "The saved copy could not be used (see the log), so the documents are read instead. "
        if not session.is_prefilled:  # a read cut short: it goes on from there
            return f"Continuing the read saved at {stats.num_tokens:,} tokens. "
        state.saved_key = saved.key
        bar = render.progress_bar(stats.num_tokens, stats.num_tokens, state="done", note="reopened from disk")
        seconds = render.format_short_seconds(stats.seconds)
        yield ReadView(state, bar, _reopened(stats), NO_CHANGE, *_idle(state, False),
                       plan=_panel(session, num_chosen, f"reopened from disk in {seconds}"))
        return None

    def _prefill(self, session: DocumentSession, tokens: DocumentTokens, truncate: bool, state: BrowserState,
                 ticket: Ticket, checkpoints, reading: str) -> Iterator[ReadView]:
        """Runs the read on a thread of its own, showing its progress and its pauses for other visitors; returns
        (read to the end?, its last progress report). Stopped or failed, the plan forecasts the rest."""
        total = session.document_tokens
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
                        self.app.queue.position(ticket), f"Paused after {done:,} of {total:,} tokens so that another "
                        f"visitor goes first; the read goes on from there. {item}"), NO_CHANGE, *_RUNNING)
                    continue
                last = item
                state.read_done = item.tokens_done  # the meters fill as the read goes (``app.meters.live_kv``)
                bar = render.progress_bar(last.tokens_done, last.tokens_total, last.tokens_per_second,
                                          last.eta_seconds, state="running")
                if last.eta_seconds is not None:
                    self.app.queue.expect(ticket, last.eta_seconds)
                yield ReadView(state, bar, reading if paused else NO_CHANGE, NO_CHANGE, *_RUNNING)
                paused = False
        except PrefillCancelled:
            done = session.prefilled_tokens
            head = tokens.head(done) if tokens.text == session.document else None
            where = last_page(head, tokens.text) if head else None
            stopped = f" It stopped in {where}." if where else ""
            yield ReadView(state, render.progress_bar(done, total, state="cancelled", note="cancelled"),
                           status("warn", f"Cancelled after {done:,} of {total:,} tokens.{stopped} Press “Read "
                                          "documents” to continue from there."), NO_CHANGE, *_idle(state, truncate),
                           plan=_rest_panel(session, len(tokens)))
            return False, last
        except MemoryError as exc:
            logger.warning("prefill ran out of memory: %s", exc)
            yield ReadView(state, render.progress_bar(session.prefilled_tokens, total, state="failed",
                                                      note="out of memory"),
                           _warn(f"{exc}. What was read so far is kept: “Read documents” continues from there."),
                           NO_CHANGE, *_idle(state, truncate), plan=_rest_panel(session, len(tokens)))
            return False, last
        finally:
            state.read_done = None  # the cache counts what is read now
        return True, last

    @staticmethod
    def _finish(session: DocumentSession, tokens: DocumentTokens, state: BrowserState, shelf: SavedDocs | None,
                start: int, last: PrefillProgress | None) -> Iterator[ReadView]:
        """The read's last line: what was read, how fast, where a truncated read stopped; saved onto ``shelf``
        first, when the tab remembers documents. The plan then says the read's own time, not the forecast."""
        total, text = session.document_tokens, tokens.text
        seconds = f" in {render.format_seconds(last.elapsed)} ({last.tokens_per_second:,.0f} tok/s)" if last else ""
        # This run's own tokens: a read resumed after a cancel reads only the rest.
        finished = f"Read {total - start:,} tokens{seconds}" + (f", the rest of {total:,}." if start else ".")
        if session.document != text and (where := last_page(session.document)):  # truncated to fit
            finished += f" It stopped in {where}: the pages after it were not read."
        elif state.range_label:
            finished += f" Read {state.range_label}."
        kind = "ok"
        if shelf is not None:
            yield ReadView(state, _done_bar(session, last), status("info", f"{finished} Saving it for instant "
                                                                           "reopening…"), NO_CHANGE, *_BUSY)
            kind, sentence = shelf.save(session, _label(state, session, text), tuple(state.documents))
            if kind == "ok":
                state.saved_key = session.snapshot_identity().key
            if kind == "error":
                gr.Warning(escape.text(sentence))
            finished += " " + sentence
        yield ReadView(state, _done_bar(session, last), status("ok" if kind == "ok" else "warn",
                                                               f"{finished} Ask a question."), NO_CHANGE,
                       *_idle(state, False),
                       plan=_panel(session, len(tokens), read_seconds=last.elapsed if last else None))

    def _giving_way(self, ticket: Ticket, state: BrowserState, report: Callable[[object], None]) -> Callable[[], None]:
        """What a read does between its chunks: when other visitors wait, it gives them the device (the line's
        ``give_way``) and tells its tab so (``report(sentence)``); leaving the line while paused cancels the read."""
        piece_started = [time.monotonic()]

        def give_way() -> None:
            if not self.app.queue.give_way(ticket, lambda: state.cancel_requested or state.is_closed, report,
                                           time.monotonic() - piece_started[0]):
                state.cancel_requested = True  # out of the line: not one more chunk
            piece_started[0] = time.monotonic()

        return give_way

    @staticmethod
    def cancel(state: BrowserState) -> None:
        state.cancel_requested = True

    @staticmethod
    def read_offer(truncate: bool, state: BrowserState):
        """“Read documents” after an event that changed what it would read (``app.read_offer``'s rule); a running
        read or answer owns the button meanwhile, and the page asks again when it ends."""
        return gr.skip() if state.is_busy else read_button(state, truncate)


def _idle(state: BrowserState, truncate: bool) -> tuple:
    """The read and cancel buttons once nothing runs: Read by ``app.read_offer``'s rule, Cancel off."""
    return read_button(state, truncate), gr.update(interactive=False)


def _warn(text: str) -> str:
    gr.Warning(escape.text(text))
    return status("error", text)


def _kept(state: BrowserState) -> str:
    if state.session is not None and state.session.is_prefilled:
        return " The documents already read stay loaded; you can keep asking about them."
    return ""


def _reopened(stats: RestoreStats) -> str:
    bandwidth = format_rate(stats.gb_per_second * 1e9)  # binary units, as every size on the page
    seconds = render.format_short_seconds(stats.seconds)
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


def _panel(session: DocumentSession, num_chosen: int, reading_time: str | None = None, *,
           seconds=None, read_seconds: float | None = None) -> str:
    """The plan panel of the document taken: of what is read when it was truncated to fit, out of ``num_chosen``
    tokens. Its reading time: ``seconds``' estimate, the read's own ``read_seconds`` once over, or ``reading_time``'s
    words (the read is running, the copy reopening)."""
    plan = session.document_plan()
    truncated = {"truncated_from": num_chosen, "stopped_in": last_page(session.document)} if num_chosen > \
        session.document_tokens else {}
    panel = render.plan_panel(plan, session.document_tokens, seconds, session.policy.kv_dtype, _options(session, plan),
                              conversation_tokens=session.answer_budget, read_seconds=read_seconds,
                              weights=getattr(session, "weights", None), **truncated)
    return panel if reading_time is None else with_reading_time(panel, reading_time)


def _rest_panel(session: DocumentSession, num_chosen: int) -> str:
    """The plan panel of a read stopped or failed part-way: the forecast of what is left to read."""
    done, total = session.prefilled_tokens, session.document_tokens
    estimate = session.read_time.estimate_prefill_range(total, done)
    return _panel(session, num_chosen, f"{render.reading_time(estimate)} for the {total - done:,} tokens left")


def _options(session: DocumentSession, plan) -> list:
    """Capacity options, shown when memory is what binds the context (not the model's window or a setting)."""
    if plan.limited_by != "memory" or not hasattr(session, "capacity_options"):
        return []
    return session.capacity_options()
