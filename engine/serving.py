"""The model the running app serves, and switching it: the old model's memory is given back, open documents close.

``ModelHolder.new_session`` is the app's session factory. ``switch`` loads the new model first (a failed load
leaves the old one serving), then retires every live session of the old one: its KV is freed, its model and
tokenizer references are dropped and ``retired`` says why, so the app can tell the tab and start it afresh. Saved
documents need nothing: a snapshot's identity includes the model that read it (``engine.store.fingerprint``), so each
stays tied to its model and reopens only under it.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from .interrupt import stop_on_ctrl_c
from .models.loader import describe
from .models.memory import release_memory
from .planning.policy import OffloadPolicy
from .session import DocumentSession

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SwitchReport:
    old: str
    new: str
    closed_documents: int  # sessions that had a document open
    rss_before: int  # bytes, this process, with both models loaded
    rss_after: int  # after the old model and its sessions were released
    load_seconds: float

    @property
    def returned_bytes(self) -> int:
        return max(self.rss_before - self.rss_after, 0)


class ModelHolder:
    """Owns the served ``(model, tokenizer)``; every session the app uses comes from ``new_session``."""

    def __init__(self, model: Any, tokenizer: Any, policy: OffloadPolicy, name: str,
                 loader: Callable[[str | None], tuple[Any, Any]] | None = None):
        self.model, self.tokenizer, self.policy, self.name = model, tokenizer, policy, name
        self._loader = loader
        self.serial = 0  # counts switches: what the app compares to notice one
        self._info: tuple[int, dict] | None = None
        self._sessions: weakref.WeakSet[DocumentSession] = weakref.WeakSet()
        self._lock = threading.Lock()

    def new_session(self) -> DocumentSession:
        with self._lock:
            session = DocumentSession(self.model, self.tokenizer, self.policy)
            session.retired = None  # set to a note when the model it reads with is switched away
            self._sessions.add(session)
            return session

    @staticmethod
    def stop_on_ctrl_c(wait_seconds: float = 120.0):
        """The app serving inside the ``with``: Ctrl+C stops every read and answer at its next layer, each read keeping
        a checkpoint of what it read, and leaving it waits for them (``interrupt.stop_on_ctrl_c``)."""
        return stop_on_ctrl_c(wait_seconds)

    def info(self) -> dict:
        """``describe`` of the served model with its ``serial``, computed once per model."""
        with self._lock:
            if self._info is None or self._info[0] != self.serial:
                self._info = (self.serial, {**describe(self.model), "serial": self.serial})
            return self._info[1]

    def switch(self, source: str | None, name: str | None = None) -> SwitchReport:
        """Loads ``source`` (as ``load_model`` takes it) and makes it the served model.

        Raises whatever the loader raises (unsupported, missing, gated); the old model then keeps serving.
        """

        if self._loader is None:
            raise RuntimeError("this holder was made without a loader")
        started = time.perf_counter()
        model, tokenizer = self._loader(source)
        load_seconds = time.perf_counter() - started
        new_name = name or source or "embedded model"
        rss_before = _rss()
        with self._lock:
            old_name, retired = self.name, list(self._sessions)
            closed = sum(1 for s in retired if s.document)
            note = (f"The model was switched from {old_name} to {new_name}: open documents were closed. "
                    f"Documents saved with {old_name} stay tied to it and reopen when it is served again.")
            for session in retired:
                retire(session, note)
            self._sessions = weakref.WeakSet()
            self.model, self.tokenizer, self.name = model, tokenizer, new_name
            self.serial += 1
        del model, tokenizer, retired
        release_memory()
        report = SwitchReport(old_name, new_name, closed, rss_before, _rss(), load_seconds)
        logger.info("switched %s -> %s: %.2f GiB returned", old_name, new_name, report.returned_bytes / 2**30)
        return report


def retire(session: DocumentSession, note: str) -> None:
    """Frees the session's KV and drops its references to the model, so the model can be freed."""
    try:
        session.clear()
    except Exception:  # a session mid-way through a cancelled read: what matters is letting go of the model
        logger.exception("clearing a retired session failed")
    session.retired = note
    session.model = session.tokenizer = None
    session.prompts = None
    session.read_time = None  # its read estimates (engine.read_time) hold the model too


def _rss() -> int:
    return psutil.Process().memory_info().rss
