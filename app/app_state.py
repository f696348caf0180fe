"""What every tab's handlers share: the one object each handler piece (``app.reading``, ``app.questions``,
``app.saved.open_saved``) gets in its constructor, beside ``BrowserState``, which is one tab's.

Its fields are public because the pieces read them, and it is the only thing they share: a piece never reads
another piece's fields. Nobody reassigns a field (frozen); the line, the shelves and the recent answers' numbers
change inside their own objects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from app.browser_state import BrowserState
from app.compute_queue import ComputeQueue, Ticket
from app.saved.shelves import Shelves
from app.tab_owner import is_owner
from app.visitor_caps import VisitorCaps
from app.answer_record import AnswerRecord
from engine import DocumentSession


@dataclass(frozen=True)
class AppState:
    """The app's shared parts.

    Args:
        new_session: returns a fresh ``DocumentSession`` for a tab (sharing one loaded model).
        shelves: whose saved documents each visitor sees (``app.saved.shelves``).
        queue: the line for the compute device (``app.compute_queue``).
        max_question: the longest question in tokens (None: what the plan leaves beside the document and answer).
        upload_dir: where Gradio keeps uploads (a tab's are deleted when it closes); None: not ours to delete.
    """

    new_session: Callable[[], DocumentSession]
    shelves: Shelves
    queue: ComputeQueue = field(default_factory=ComputeQueue)
    max_question: int | None = None
    upload_dir: Path | None = None
    caps: VisitorCaps = field(default_factory=VisitorCaps)  # per-visitor caps (``app.visitor_caps``; none: the owner's)
    # The last answers' lengths, rates and times: how long a running or queued one likely takes (``app.answer_record``).
    answers: AnswerRecord = field(default_factory=AnswerRecord)
    # Browser session id -> its state, only so ``Handlers.unload`` can free a closed tab's memory at once; the
    # handlers themselves always get their state from gr.State.
    tabs: dict[str, BrowserState] = field(default_factory=dict)

    def session(self, state: BrowserState, request: gr.Request | None) -> DocumentSession:
        """The tab's session, made on first use (and again after a model switch let go of the old one)."""
        self.forget_switched(state)
        if state.session is None:
            state.session = self.new_session()
        self.remember_tab(state, request)
        return state.session

    def remember_tab(self, state: BrowserState, request: gr.Request | None) -> None:
        """Notes the tab behind ``request``, so that closing it frees its memory and uploads (``Handlers.unload``)."""
        if request is not None and request.session_hash:
            is_owner(state, request)  # binds an unbound tab to this login (the handlers refused any other already)
            self.tabs[request.session_hash] = state

    @staticmethod
    def forget_switched(state: BrowserState) -> str | None:
        """The note of a session whose model was switched away (``engine.models.ModelHolder.switch``), which the
        tab then lets go of: its chosen files stay, to be read again with the new model. None: nothing to forget."""
        note = getattr(state.session, "retired", None) if state.session is not None else None
        if note:
            state.session, state.tokens, state.read_text = None, None, None  # tokens were the old tokenizer's
        return note

    def in_line(self, ticket: Ticket, should_leave: Callable[[], bool], view: Callable[[str], object]) -> Iterator:
        """Waits for ``ticket`` to reach the front of the line, yielding ``view(status line)`` with the place in line
        and the wait; returns False when the visitor left the line (``should_leave``)."""
        return (yield from self.queue.in_line(ticket, should_leave, view))
