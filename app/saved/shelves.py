"""Whose saved documents a visitor sees.

Run locally by its owner, the app has one shelf: every tab sees and reopens every saved document. Once
others can reach it (``--share``, or a ``--host`` that is not loopback), each visitor gets a shelf of
their own: per user name with ``--auth`` (kept on disk, under the store's ``users/`` folder), otherwise per
browser (``app.browser_id``'s cookie; a client without one: per tab), in a temporary folder deleted
``BROWSER_GRACE_SECONDS`` after the browser's last tab closed (a reload closes its tab and opens another: the new tab
reopens the document the old one saved). Each shelf has its own cap and all of them together another
(``total_bytes``, within the store's cap): without a login one client can make up any number of sessions or
browser ids, each a shelf.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import threading
from pathlib import Path

from app.browser_id import browser_id
from app.disk_usage import folder_bytes
from app.saved.saved_docs import SavedDocs
from app.visitor_caps import CapLimits
from engine import SnapshotStore, format_bytes

logger = logging.getLogger(__name__)

USERS_FOLDER = "users"
BROWSER_GRACE_SECONDS = 600.0  # a browser's shelf outlives its last tab this long (a reload, a tab closed by mistake)


class Shelves:
    """Hands each request the ``SavedDocs`` its visitor may see.

    Args:
        store: the owner's store (``None``: nothing is saved for anyone).
        private: whether visitors are kept apart.
        session_root: where per-session shelves go when ``private`` and nobody logs in (a temporary
            folder of this process's own).
        visitor_bytes: the most each visitor's shelf may take (``app.visitor_caps.CapLimits.shelf_bytes``), within
            the store's own cap; None: the store's cap alone.
        total_bytes: the most all visitors' shelves may take together (``CapLimits.shelves_total_bytes``), within
            the store's own cap: a save past it is refused whole, saying so.
    """

    def __init__(self, store: SnapshotStore | None, *, private: bool = False, session_root: Path | None = None,
                 visitor_bytes: int | None = None, total_bytes: int | None = CapLimits.shelves_total_bytes):
        self.store, self.private, self.session_root = store, private, session_root
        self.visitor_bytes = visitor_bytes
        caps = [cap for cap in (store.max_bytes if store is not None else None, total_bytes) if cap is not None]
        self.total_bytes = min(caps, default=None)
        self._shared = SavedDocs(store)
        self._by_owner: dict[str, SavedDocs] = {}
        self._lock = threading.Lock()
        self._tabs: dict[str, set[str]] = {}  # a browser's shelf key -> the session hashes of its open tabs
        self._browser_of: dict[str, str] = {}  # session hash -> its browser's shelf key
        self._leaving: dict[str, threading.Timer] = {}  # a browser with no tab open -> its shelf's deletion

    def for_request(self, request) -> SavedDocs:
        """The shelf of the visitor behind ``request`` (a ``gr.Request``; None: no shelf when private)."""
        if self.store is None or not self.private:
            return self._shared
        username = getattr(request, "username", None) if request is not None else None
        session = getattr(request, "session_hash", None) if request is not None else None
        if username:
            return self._within_total(self._shelf(f"user:{username}", self.store.root / USERS_FOLDER / _digest(username)))
        if session and self.session_root is not None:
            browser = browser_id(request)
            if browser is not None:
                owner = f"browser:{browser}"
                self._tab_opened(owner, session)
                return self._within_total(self._shelf(owner, self.session_root / _digest(owner)))
            return self._within_total(self._shelf(f"session:{session}", self.session_root / _digest(session)))
        return SavedDocs(None)

    def _within_total(self, shelf: SavedDocs) -> SavedDocs:
        """The shelf, its cap lowered to what the other visitors' shelves leave of ``total_bytes`` (the store then
        refuses a save past it whole, and says whose cap it is)."""
        if shelf.store is None or self.total_bytes is None:
            return shelf
        own = folder_bytes(shelf.store.root)
        roots = [self.store.root / USERS_FOLDER] + ([self.session_root] if self.session_root is not None else [])
        others = sum(folder_bytes(root) for root in roots) - own
        room = max(self.total_bytes - others, 0)
        limit, note = room, f"left of the {format_bytes(self.total_bytes)} all visitors may keep together"
        if self.visitor_bytes is not None and self.visitor_bytes <= room:
            limit, note = self.visitor_bytes, "each visitor may keep"
        elif others <= 0 and room == self.store.max_bytes:
            note = "allowed for saved documents"
        shelf.store.max_bytes, shelf.cap_note = limit, note
        return shelf

    def close_session(self, session_hash: str) -> None:
        """The tab closed: its per-session shelf (if any) is deleted from disk; its browser's, once no tab of that
        browser has been open for ``BROWSER_GRACE_SECONDS``."""
        self._delete(f"session:{session_hash}", "a closed tab's")
        with self._lock:
            owner = self._browser_of.pop(session_hash, None)
            tabs = self._tabs.get(owner, set()) if owner is not None else None
            if tabs is None:
                return
            tabs.discard(session_hash)
            if tabs or owner in self._leaving:
                return
            timer = threading.Timer(BROWSER_GRACE_SECONDS, self._browser_left, args=(owner,))
            timer.daemon = True
            self._leaving[owner] = timer
        timer.start()

    def _tab_opened(self, owner: str, session_hash: str) -> None:
        with self._lock:
            before = self._browser_of.get(session_hash)
            if before is not None and before != owner:  # the tab came back with another browser's id
                self._tabs.get(before, set()).discard(session_hash)
            self._tabs.setdefault(owner, set()).add(session_hash)
            self._browser_of[session_hash] = owner
            leaving = self._leaving.pop(owner, None)
        if leaving is not None:  # back within the grace time (a reload): the shelf stays
            leaving.cancel()

    def _browser_left(self, owner: str) -> None:
        with self._lock:  # (run by the timer: it is the current thread unless a tab came back meanwhile)
            if self._leaving.get(owner) is not threading.current_thread() or self._tabs.get(owner):
                return
            del self._leaving[owner]
            self._tabs.pop(owner, None)
        self._delete(owner, "a browser's")

    def _delete(self, owner: str, whose: str) -> None:
        shelf = self._by_owner.pop(owner, None)
        if shelf is not None and shelf.store is not None:
            shutil.rmtree(shelf.store.root, ignore_errors=True)
            logger.info("deleted %s saved documents", whose)

    def _shelf(self, owner: str, root: Path) -> SavedDocs:
        shelf = self._by_owner.get(owner)
        if shelf is None:
            # A save past the cap is refused whole by the store (nothing half-written); a checkpoint stops.
            limit = min((cap for cap in (self.store.max_bytes, self.visitor_bytes) if cap is not None), default=None)
            note = "each visitor may keep" if limit is not None and limit == self.visitor_bytes else \
                "allowed for saved documents"
            try:
                shelf = SavedDocs(SnapshotStore(root, max_bytes=limit), cap_note=note)
            except OSError as exc:
                logger.warning("saved documents are off for a visitor: cannot use %s (%s)", root, exc)
                shelf = SavedDocs(None)
            self._by_owner[owner] = shelf
        return shelf


def _digest(name: str) -> str:
    """A folder name for a user or session that reveals neither and cannot climb out of its parent."""
    return hashlib.sha256(name.encode()).hexdigest()[:24]
