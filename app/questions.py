"""Questions: checked against the model's window and the plan before any work (refused at once with the numbers),
then a wait in the device's line, then the answer streamed from a thread of its own, stoppable between layers for
the question's own tokens too (a handler piece of ``app.handlers.Handlers``, sharing only its ``AppState``).

The question is tokenized once per ask: ``fit_question`` gives the ids it will be asked with (or refuses it), and
those ids go on to the line's estimate and to ``DocumentSession.ask`` (``fit=``). Only ``--max-question`` counts the
question's own tokens apart, as that limit is stated in them."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import gradio as gr

from app import escape, render, turn_notes
from app.app_state import AppState
from app.background import iterate_reports
from app.browser_state import BrowserState
from app.compute_queue import ordinal
from app.pages import chip, cited_pages, split_pages
from app.render import status
from app.views import AskView
from app.visitor_caps import CapReached
from engine import DocumentSession, HeadInferError, QuestionTooLong
from engine.types import RepetitionGuard

logger = logging.getLogger(__name__)

NO_CHANGE: dict = gr.update()
# A question longer than this many characters is refused before it is tokenized (a 10 MB one took 14 s and 1 GiB
# to count); also the question box's own limit (``app.ui``). A token is rarely more than 8 characters of text.
QUESTION_CHARS = 1_000_000
CHARS_PER_TOKEN = 8
# The "Longest answer" slider's maximum, and the API's max_tokens when a request names none (within the room the
# plan leaves); the engine's conversation allowance plans for at least this (tests/app/test_api.py).
LONGEST_ANSWER = 2048
_MIN_ROOM = 1024  # tokens: the least room a question's character cap is counted from


class Questions:
    """Asking about the read documents."""

    def __init__(self, app: AppState):
        self.app = app

    def ask(self, question: str, history: list[dict] | None, max_new_tokens: float, temperature: float,
            state: BrowserState, avoid_repeats: bool = True, show_sources: bool = True,
            request: gr.Request = None) -> Iterator[AskView]:
        """Streams the answer into the chat, followed by its TTFT / tokens / tok/s line and its sources."""
        try:
            held = self.app.caps.take("question", state, request)
        except CapReached as exc:  # a visitor at a cap: refused at once, saying which
            yield AskView(list(history or []), NO_CHANGE, _warn(f"Not asked: {exc}."), NO_CHANGE)
            return
        with held, state.working():
            yield from self._ask(question, history, max_new_tokens, temperature, state, avoid_repeats, show_sources)

    def _ask(self, question: str, history: list[dict] | None, max_new_tokens: float, temperature: float,
             state: BrowserState, avoid_repeats: bool, show_sources: bool) -> Iterator[AskView]:
        history = list(history or [])
        question = (question or "").strip()
        if not question:
            yield AskView(history, NO_CHANGE, NO_CHANGE, NO_CHANGE)
            return
        session = state.session
        if session is None or not session.is_prefilled:
            yield AskView(history, NO_CHANGE, _warn(_not_read(session)), NO_CHANGE)
            return
        state.stop_requested = False
        max_new_tokens = int(max_new_tokens)
        # Checked before any work and before the queue: a question that cannot fit is refused at once.
        refusal, fit = self._refusal(session, question, max_new_tokens)
        if refusal:
            history += [{"role": "user", "content": _preview(question)},
                        {"role": "assistant", "content": f"*(not asked: {escape.text(refusal)})*"}]
            yield AskView(history, NO_CHANGE, _warn(f"Not asked: {refusal}."), NO_CHANGE)
            return
        history += [{"role": "user", "content": _preview(question)}, {"role": "assistant", "content": "…"}]
        # Expected: a usual answer here, plus reading the ids the question is asked with (long questions take long).
        question_seconds = session.read_time.estimate_prefill_seconds(session.document_tokens + len(fit.ids),
                                                                    session.document_tokens)
        queue = self.app.queue
        ticket = queue.join("answering a question", self.app.answers.expected_seconds(max_new_tokens) + question_seconds)
        try:
            def waiting(line: str) -> AskView:  # the wait in the chat's pending bubble too, where the visitor looks
                history[-1] = {"role": "assistant", "content": _waiting(queue.position(ticket), ticket.shown_seconds)}
                return AskView(list(history), "", line, NO_CHANGE)

            if not (yield from self.app.in_line(ticket, lambda: state.stop_requested or state.is_closed, waiting)):
                history[-1] = {"role": "assistant", "content": "*(left the queue before an answer)*"}
                yield AskView(list(history), NO_CHANGE, status("info", "You left the queue; nothing was asked."),
                              NO_CHANGE)
                return
            history[-1] = {"role": "assistant", "content": "…"}
            # A conversation restored from the tab's memory is not in the cache: the first question reads it again.
            rereading = state.turns_unread and bool(session.conversation())
            thinking = (f"Re-reading the conversation ({len(fit.ids):,} tokens: {len(session.conversation())} earlier "
                        "turns and the question)…") if rereading else "Thinking…"
            yield AskView(list(history), "", status("info", thinking), NO_CHANGE)
            yield from self._answer(session, question, fit, history, max_new_tokens, float(temperature), state,
                                    RepetitionGuard() if avoid_repeats else None, bool(show_sources), ticket)
        finally:
            queue.leave(ticket)

    def _refusal(self, session: DocumentSession, question: str, max_new_tokens: int) -> tuple[str, object]:
        """Why ``question`` cannot be asked (the numbers), or "" with the ``ConversationFit`` it will be asked with
        (``session.fit_question``'s, handed on to ``session.ask``: the question is tokenized once)."""
        limit = self.app.max_question
        # Short questions go on to the token checks below, which say the numbers in tokens: room is never counted
        # below _MIN_ROOM tokens, so only a question past that many characters needs the room at all.
        if len(question) > CHARS_PER_TOKEN * _MIN_ROOM:
            room = limit if limit is not None else session.question_room(max_new_tokens)
            # 4x slack: a question near its room gets the exact token numbers below; one far past it is never read
            chars = min(QUESTION_CHARS, 4 * CHARS_PER_TOKEN * max(room, _MIN_ROOM))
            if len(question) > chars:
                return (f"the question has {len(question):,} characters and this app takes questions of at most "
                        f"{chars:,} characters here"), None
        if limit is not None:
            num_tokens = session.count_tokens(question)
            if num_tokens > limit:
                return (f"the question takes {num_tokens:,} tokens and this app takes questions of at most "
                        f"{limit:,} (--max-question)"), None
        try:
            return "", session.fit_question(question, max_new_tokens)
        except QuestionTooLong as exc:
            return str(exc), None

    def _answer(self, session: DocumentSession, question: str, fit, history: list[dict], max_new_tokens: int,
                temperature: float, state: BrowserState, guard, show_sources: bool, ticket) -> Iterator[AskView]:
        """Streams the answer, computed on a thread of its own: its between-layer stop checks belong to that
        thread, and a closed page (Gradio closing this generator) stops it and waits for it."""
        def work(report) -> None:
            for chunk in session.ask(question, fit=fit, max_new_tokens=max_new_tokens, temperature=temperature,
                                     should_stop=lambda: state.stop_requested or state.is_closed,
                                     repetition_guard=guard, sources=show_sources,
                                     on_question_progress=lambda done, total: report((done, total))):
                report(chunk)

        started, writing = time.monotonic(), status("info", "Writing the answer…")
        # Seconds it waited in line, said beside its first-token time (None: it was at the front at once).
        waited = started - ticket.joined if ticket.shown_seconds is not None else None
        answers, last_token = self.app.answers, started
        try:
            for item in iterate_reports(work, abandon=lambda: setattr(state, "stop_requested", True),
                                        min_interval=0.1, name="answer"):
                if isinstance(item, tuple):  # (done, total) tokens of the question read so far
                    # The question's rest at the rate it reads, then a whole answer (a slow question read must not
                    # run the wait down to "about 1.0 s" for those behind it).
                    done, total = item
                    question_left = (time.monotonic() - started) * (total - done) / done if done else 0.0
                    self.app.queue.expect(ticket, question_left + answers.expected_seconds(max_new_tokens))
                    what = "Re-reading the conversation" if state.turns_unread and session.conversation() else \
                        "Reading the question"
                    yield AskView(list(history), NO_CHANGE,
                                  status("info", f"{what}: {item[0]:,} of {item[1]:,} tokens…"), NO_CHANGE)
                    continue
                chunk = item
                if not chunk.done:  # those waiting behind it: the rest of the answer at the rate it writes now
                    self.app.queue.expect(ticket, self._answer_left(chunk, max_new_tokens))
                    last_token = time.monotonic()
                stats = _stats(chunk, session.dropped_turns, max_new_tokens, waited)
                if chunk.done and not chunk.stopped:
                    now = time.monotonic()
                    answers.record(chunk.num_tokens, chunk.tokens_per_second, now - last_token, now - started)
                pages = split_pages(session.document) if chunk.sources else None
                # A stopped or cut answer is not the model's whole answer: no "the document may not say" on it.
                support = None if chunk.stopped or _cut(chunk, max_new_tokens) else chunk.support
                history[-1] = {"role": "assistant",
                               "content": render.answer_message(chunk.text, stats, chunk.sources, pages, support)}
                if chunk.done:
                    _keep_note(state, session, question, chunk, turn_notes.note_of(stats, chunk.sources, support))
                # A copy per update: each yielded view is a snapshot, not a list edited later.
                chips = self._page_chips(session, chunk) if chunk.done else NO_CHANGE
                # Once the answer is being written the question's "Reading the question: 12 of 12" is over.
                line = status("ok", stats) if chunk.done else writing
                writing = NO_CHANGE
                yield AskView(list(history), NO_CHANGE, line, chips)
        except (HeadInferError, MemoryError) as exc:  # refused or out of memory; a bug surfaces
            logger.warning("answer failed: %s", exc)
            history[-1] = {"role": "assistant", "content": f"*(no answer: {escape.text(str(exc))})*"}
            yield AskView(history, NO_CHANGE, _warn(str(exc)), NO_CHANGE)

    def _answer_left(self, chunk, max_new_tokens: int) -> float:
        """Seconds a running answer likely has left (``AnswerRecord.seconds_left``: its own limit, length and rate)."""
        return self.app.answers.seconds_left(chunk.num_tokens, max_new_tokens, chunk.tokens_per_second)

    def question_bar(self, max_new_tokens: float, state: BrowserState) -> str:
        """The longest question this tab may ask now (shown under the question box)."""
        session = state.session
        if session is None or not session.is_prefilled:
            return render.question_bar(None, int(max_new_tokens))
        room = session.question_room(int(max_new_tokens))
        limit = self.app.max_question
        if limit is not None and limit < room:
            return render.question_bar(limit, int(max_new_tokens), "--max-question")
        return render.question_bar(room, int(max_new_tokens))

    @staticmethod
    def stop(state: BrowserState) -> None:
        state.stop_requested = True

    @staticmethod
    def new_chat(state: BrowserState) -> tuple[list, str]:
        if not state.wait_idle():
            return NO_CHANGE, _warn("Still stopping the answer; press “New chat” again in a moment.")
        if state.session is not None:
            state.session.new_conversation()
        state.turn_notes, state.turns_unread = [], False
        return [], status("info", "New chat. The documents stay read.")

    @staticmethod
    def _page_chips(session, chunk) -> dict:
        """Chips for the pages the answer cites, then those it attended to most."""
        known = split_pages(getattr(session, "document", "") or "")
        chosen = cited_pages(chunk.text, known)
        chosen += [str(s.page) for s in chunk.sources
                   if s.page is not None and str(s.page) in known and str(s.page) not in chosen]
        return gr.update(choices=[(chip(label), label) for label in chosen], value=None, visible=bool(chosen))


def _stats(chunk, dropped_turns: int, max_new_tokens: int, waited: float | None) -> str:
    """The answer's stats line: its first-token time (after how long in line), tokens and rate, and how it ended when
    that was not the model's own end: stopped, a loop cut off, or cut at its limit (with the limit's number)."""
    stats = render.answer_stats(chunk.ttft, chunk.num_tokens, chunk.tokens_per_second, done=chunk.done,
                                stopped=chunk.stopped, waited=waited)
    if chunk.looped:
        stats += " · stopped a repeating loop"
    if chunk.done and chunk.stopped and chunk.num_tokens == 0:
        stats = "stopped before the answer began"
    if _cut(chunk, max_new_tokens):
        stats += f" · cut at {max_new_tokens:,} tokens — raise the limit under Answer settings"
    if chunk.done and dropped_turns:
        stats += (f" · the {dropped_turns} oldest question{'s' if dropped_turns > 1 else ''}"
                  " and answers left out to make room")
    return stats


def _cut(chunk, max_new_tokens: int) -> bool:
    """Whether the answer ended at its token limit rather than where the model ended it."""
    return chunk.done and not chunk.stopped and not chunk.looped and chunk.num_tokens >= max_new_tokens


def _waiting(position: int, seconds: float | None) -> str:
    """The pending answer's bubble while it waits for the compute device: its place and wait, as the status line."""
    wait = f", about {render.format_seconds(seconds)}" if seconds is not None else ""
    return (f'<span class="answer-waiting" data-queue-position="{position}" data-wait-seconds="{seconds or 0:.1f}">'
            f"⏳ Waiting for the compute device: {ordinal(position)} in line{wait}…</span>")


def _warn(text: str) -> str:
    gr.Warning(escape.text(text))
    return status("error", text)


def _not_read(session: DocumentSession | None) -> str:
    """Why a question cannot be asked yet: nothing read, or a read cancelled part-way (which can continue)."""
    if session is not None and session.document_tokens and session.prefilled_tokens < session.document_tokens:
        return (f"Reading was cancelled after {session.prefilled_tokens:,} of {session.document_tokens:,} tokens — "
                "continue? Press “Read documents” to read the rest, then ask.")
    return "Read documents first: drop files, then press “Read documents”."


def _preview(question: str, limit: int = 2000) -> str:
    """The question as the chat shows it: a long one is cut (the model still reads all of it)."""
    if len(question) <= limit:
        return question
    return f"{question[:limit]}… ({len(question):,} characters in all)"


def _keep_note(state: BrowserState, session: DocumentSession, question: str, chunk, note: dict) -> None:
    """Keeps what the chat showed beside the answer with its turn, once the session recorded the turn (a stop before
    the answer began records none); the conversation is in the cache from now on."""
    turns = session.conversation()
    if turns and turns[-1] == (question, chunk.text):
        state.turn_notes = [*turn_notes.aligned(state.turn_notes, len(turns) - 1), note]
        state.turns_unread = False
