"""Event handlers: thin (generator) functions between the Gradio page and one ``DocumentSession``
per browser session.

``Handlers`` is composed of pieces, each an object of its own that gets the one ``AppState`` every tab shares (the
session factory, the device's line, the shelves, the recent answers' numbers) in its constructor and reads nothing of
another piece: ``Reading`` (``app.reading``: choose files, read, cancel), ``PageRanges`` (``app.page_ranges``: which pages
of a set too large to read whole), ``Questions`` (``app.questions``: ask, stop, new chat, the question bar) and
``OpenSaved`` (``app.saved.open_saved``: the saved documents, listed, deleted, reopened, resumed after a reload). What belongs
to the tab as a whole (the page viewer, clear, meters, closing) is here.

Each handler takes the browser's :class:`BrowserState` (kept in a ``gr.State``) and returns a
named tuple from ``app.views`` whose fields match the outputs wired in ``app/ui.py``, so tests can
call the handlers directly and read ``view.plan`` instead of ``out[2]``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import gradio as gr

from app import escape, render
from app.app_state import AppState
from app.questions import Questions
from app.browser_state import BrowserState
from app.page_ranges import PageRanges
from app.compute_queue import ComputeQueue
from app.meters import live_kv, meters_html
from app.saved.open_saved import OpenSaved
from app.pages import split_pages
from app.reading import Reading
from app.render import status
from app.saved.shelves import Shelves
from app.tab_owner import is_owner, owned
from app.uploads import delete_uploads
from app.views import ClearView
from app.visitor_caps import NO_CAPS, CapLimits, VisitorCaps
from engine import DocumentSession, SnapshotStore, read_memory

logger = logging.getLogger(__name__)

NO_CHANGE: dict = gr.update()


class Handlers:
    """The page's event functions, bound to the factory that builds a session per browser."""

    def __init__(self, engine_factory: Callable[[], DocumentSession], snapshot_store: SnapshotStore | None = None, *,
                 private: bool = False, session_shelves: Path | None = None, upload_dir: Path | None = None,
                 max_question: int | None = None, compute_queue: ComputeQueue | None = None,
                 caps: CapLimits | None = None):
        """``private``: visitors are kept apart (saved documents per user or per tab, see ``app.saved.shelves``);
        ``session_shelves``: the folder for per-tab shelves; ``upload_dir``: where Gradio keeps uploads
        (a tab's are deleted when it closes); ``max_question``: the longest question in tokens (None: what the
        plan leaves beside the document and the answer); ``compute_queue``: the line for the compute device;
        ``caps``: the per-visitor caps when ``private`` (``app.visitor_caps``; None: its defaults)."""
        limits = (caps or CapLimits()) if private else NO_CAPS
        self.app = AppState(engine_factory, Shelves(snapshot_store, private=private, session_root=session_shelves,
                                                    visitor_bytes=limits.shelf_bytes,
                                                    total_bytes=limits.shelves_total_bytes),
                            compute_queue or ComputeQueue(), max_question=max_question, upload_dir=upload_dir,
                            caps=VisitorCaps(limits))
        self.reading = Reading(self.app)
        self.ranges = PageRanges()
        self.questions = Questions(self.app)
        self.shelf = OpenSaved(self.app, read=self.reading.read)  # a partial read reopened is read on
        # The events the page wires (``app.ui``) and the tests call, each the piece's own bound method.
        self.choose_files, self.read, self.cancel = self.reading.choose_files, self.reading.read, self.reading.cancel
        self.read_offer = self.reading.read_offer
        self.range_offer, self.choose_range, self.first_part = (self.ranges.range_offer, self.ranges.choose_range,
                                                                self.ranges.first_part)
        self.ask, self.stop, self.new_chat, self.question_bar = (self.questions.ask, self.questions.stop,
                                                                 self.questions.new_chat, self.questions.question_bar)
        self.saved, self.delete_saved, self.set_remember = (self.shelf.saved, self.shelf.delete_saved,
                                                            self.shelf.set_remember)
        self.open_saved, self.open_label, self.continue_reading = (self.shelf.open_saved, self.shelf.open_label,
                                                                   self.shelf.continue_reading)
        self.resume, self.tab_memory = self.shelf.resume, self.shelf.tab_memory
        # Every event that takes a tab's state refuses a login other than the tab's (``app.tab_owner``).
        for name in ("choose_files", "read", "cancel", "read_offer", "range_offer", "choose_range", "first_part", "ask",
                     "stop", "new_chat", "question_bar", "set_remember", "open_saved", "continue_reading", "resume",
                     "tab_memory", "show_page", "clear", "meters"):
            setattr(self, name, owned(getattr(self, name)))

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

    # -- memory --------------------------------------------------------------------------------------
    @staticmethod
    def clear(state: BrowserState) -> ClearView:
        """Drops the documents and frees their KV cache."""
        if not state.wait_idle():
            return ClearView(state, NO_CHANGE, NO_CHANGE, NO_CHANGE, NO_CHANGE, NO_CHANGE, NO_CHANGE,
                             _warn("Still stopping the running work; press “Clear documents” again in a moment."))
        state.close()
        state.documents, state.token_counts, state.tokens, state.full_tokens = [], [], None, None
        state.pieces, state.range_label = [], None  # the page range offer goes too (``range_offer`` hides it)
        return ClearView(state, None, render.files_table([], []), render.empty_plan(),
                         gr.update(visible=False, value=False),
                         render.progress_bar(), [], status("info", "Documents cleared; their memory is freed."),
                         gr.update(choices=[], value=None, visible=False), render.page_view(None))

    @staticmethod
    def meters(state: BrowserState | None) -> str:
        session = state.session if state is not None else None
        return meters_html(read_memory(), live_kv(session, state.read_done if state is not None else None))

    def unload(self, request: gr.Request) -> None:
        """The tab closed: free its document now rather than when Gradio expires the state, and delete
        its uploaded files and (for a visitor kept apart without a login) its saved documents."""
        if request is None or not request.session_hash:
            return
        session_hash = request.session_hash
        state = self.app.tabs.get(session_hash)
        if state is not None and not is_owner(state, request):  # /heartbeat/{hash} needs no login: not the owner's
            logger.warning("a tab's unload from another login than the tab's was ignored")
            return
        self.app.caps.tab_closed(session_hash, getattr(request, "username", None))
        self.app.tabs.pop(session_hash, None)
        if state is None:
            self.app.shelves.close_session(session_hash)
            return
        if self.app.upload_dir is not None:
            delete_uploads(state.uploads, self.app.upload_dir)
        # Its shelf goes once nothing saves into it: now, or when its running read has saved (``BrowserState.close``).
        state.when_closed = lambda: self.app.shelves.close_session(session_hash)
        state.is_closed = state.cancel_requested = state.stop_requested = True
        AppState.forget_switched(state)  # a session a model switch retired has no model left to clear with
        if not state.is_busy:  # otherwise ``working`` frees it when the running event ends
            state.close()
        logger.info("browser session closed; its document memory and uploads are freed")


def _warn(text: str) -> str:
    gr.Warning(escape.text(text))
    return status("error", text)
