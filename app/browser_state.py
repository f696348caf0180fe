"""What one browser tab owns: its engine session, its chosen documents and the flags that let a
light event (Cancel, Stop, tab closed) reach the heavy one that is running."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from app.documents import Document
from engine import DocumentSession
from engine.types import DocumentTokens


@dataclass
class BrowserState:
    """What one browser tab owns. Flags are plain bools: the Cancel/Stop events set them while
    the prefill/answer event, running in another thread, polls them through ``should_stop``
    (a threading.Event would do too, but gr.State deep-copies its initial value and locks
    cannot be copied)."""

    session: DocumentSession | None = None
    documents: list[Document] = field(default_factory=list)  # chosen files, shown in the table
    token_counts: list[int] = field(default_factory=list)
    uploads: set[str] = field(default_factory=set)  # files this tab uploaded, deleted when it closes
    tokens: DocumentTokens | None = None  # what "Read documents" reads: the chosen documents (or a page range of them)
    full_tokens: DocumentTokens | None = None  # the whole set, tokenized once (ranges are counted off it)
    pieces: list = field(default_factory=list)  # the set's pages (app.pieces), when too large to read whole
    range_label: str | None = None  # the page range chosen, "p. 1 – p. 30 of bash.pdf"; None: the whole set
    read_text: str | None = None  # the text given to the session (its KV may be partial)
    saved_key: str | None = None  # the saved copy of the document read (reopened after a page reload)
    read_done: int | None = None  # tokens the running read has done (its last progress report): the meters' fill
    # What the chat showed beside each answer (``app.turn_notes``), aligned with the session's conversation; and whether
    # that conversation came back from the tab's memory unread (the next question re-reads it, and says so).
    turn_notes: list = field(default_factory=list)
    turns_unread: bool = False
    remember: bool = True  # save read documents to disk and reopen them from there (when the app has a store)
    cancel_requested: bool = False
    stop_requested: bool = False
    is_busy: bool = False  # a prefill or an answer is using the session
    is_closed: bool = False  # the tab went away
    model_seen: object = None  # the served model this tab's header shows (``model_info()["serial"]``)
    # The login that first used this tab (``app.tab_owner``): Gradio finds a tab's state by its session hash alone.
    owner: str | None = None
    owner_bound: bool = False
    when_closed: Callable[[], None] | None = None  # what the tab's closing leaves to its last event (its shelf)

    def close(self) -> None:
        """Frees the document's memory; safe to call twice."""
        try:
            if self.session is not None:
                self.session.clear()
            self.read_text = self.saved_key = None
        finally:
            if self.is_closed and self.when_closed is not None:  # the tab went away and nothing runs in it now
                done, self.when_closed = self.when_closed, None
                done()

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Waits (a Stop or Cancel having been asked) for this tab's running read or answer to end; False if it
        is still busy after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.is_busy and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self.is_busy

    @contextmanager
    def working(self) -> Iterator[None]:
        """Marks the session busy, so a tab closing meanwhile frees it only when the work ends
        (freeing the cache under a running forward pass would crash it)."""
        self.is_busy = True
        try:
            yield
        finally:
            self.is_busy = False
            if self.is_closed:
                self.close()
