"""Per-visitor caps, so that one visitor cannot take a shared app for themselves: questions asked or waiting, reads
in flight, bytes of chosen files, documents held in memory, and (in ``app.saved.shelves``) the disk their saved documents
take.

A visitor is the logged-in user with ``--auth-file``, else the browser session; a visitor's tab is its session. A
client address that is not loopback counts too (someone opening many sessions from one machine); through the share
tunnel every visitor arrives from loopback, so there the address says nothing and is left out. Each refusal is a
``CapReached`` whose message says which cap and what to do. Nothing here runs when only the owner can reach the app
(``NO_CAPS``).

Without a login the client picks its session_hash, so one client can be any number of "visitors": the totals
(reads in flight, documents in memory, shelf bytes) bound all visitors together whatever their hashes, and a tab
that holds a document with no event for ``idle_seconds`` has it freed (a tab that never opens the heartbeat is
never unloaded), checked on every event and by a daemon thread.
"""

from __future__ import annotations

import collections
import ipaddress
import os
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CapLimits:
    """The caps (None: no cap). ``questions_per_tab`` also keeps one tab from asking twice at once."""

    questions_per_tab: int | None = 1
    questions_per_visitor: int | None = 2  # a logged-in user's tabs together
    questions_per_address: int | None = 4
    reads_per_visitor: int | None = 1
    reads_per_address: int | None = 2
    upload_bytes: int | None = 512 * 2**20  # the files a visitor's tabs hold (uploaded and not yet deleted)
    shelf_bytes: int | None = 4 * 2**30  # each visitor's saved documents on disk
    # All visitors together, whatever session_hash each client makes up (the owner alone has none of these).
    reads_total: int | None = 2
    documents_total: int | None = 4  # tabs holding a read document in memory
    documents_per_visitor: int | None = 2  # a logged-in user's tabs together (a session without login has one tab)
    shelves_total_bytes: int | None = 16 * 2**30  # every visitor's shelf together, within the store's own cap
    idle_seconds: float | None = 30 * 60  # a visitor tab's document is freed after this long with no event


NO_CAPS = CapLimits(**{cap.name: None for cap in fields(CapLimits)})  # the owner alone: the app as it always was


class _Held:
    """What ``VisitorCaps.take`` holds, given back when its ``with`` block ends (once)."""

    def __init__(self, caps: VisitorCaps, held: list[tuple[str, str]]):
        self._caps, self._held = caps, held

    def __enter__(self) -> _Held:
        return self

    def __exit__(self, *exc_info) -> None:
        held, self._held = self._held, []
        self._caps._release(held)


class CapReached(Exception):
    """A visitor is at one of the caps; the message says which and what to do."""


_WHAT = {"question": ("question", "questions", "asked or waiting for an answer"),
         "read": ("read", "reads", "running or waiting")}


@dataclass
class _Tab:
    """A tab that took a read: whose it is, its state (its document) and when its last event came."""

    visitor: str
    state: object
    last_event: float


class VisitorCaps:
    """What each visitor holds now. Thread-safe: handlers of different tabs run on Gradio's worker threads."""

    def __init__(self, limits: CapLimits = NO_CAPS, *, clock: Callable[[], float] = time.monotonic,
                 sweep_every: float | None = 60.0):
        """``clock``: seconds, for the idle check (tests pass a fake one); ``sweep_every``: how often the daemon
        thread frees idle tabs' documents (None: only on events)."""
        self.limits, self.clock, self._sweep_every = limits, clock, sweep_every
        self._lock = threading.Lock()
        self._held: collections.Counter[tuple[str, str]] = collections.Counter()
        self._files: dict[str, dict[str, int]] = {}  # visitor -> tab -> bytes of the tab's files
        self._tabs: dict[str, _Tab] = {}  # tabs that took a read, while they may hold its document
        self._sweeper: threading.Thread | None = None

    def take(self, kind: str, state, request) -> _Held:
        """One ``kind`` ("question" or "read") for the visitor behind ``request``, held until the returned
        context manager's block ends (``with caps.take(...):``); raises ``CapReached`` when they are at a cap."""
        keys = self._keys(kind, state, request)
        tab, visitor, now = _tab(request, state), _visitor(request, state), self.clock()
        try:
            with self._lock:
                known = self._tabs.get(tab)
                if known is not None:
                    known.last_event = now  # any event of the tab, refused or not, says it is not idle
                for (scope, key), limit in keys:
                    if limit is not None and self._held[(kind, key)] >= limit:
                        raise CapReached(_refusal(kind, scope, limit))
                if kind == "read":
                    self._check_documents(tab, visitor)
                    self._tabs[tab] = _Tab(visitor, state, now)
                for (_, key), _limit in keys:
                    self._held[(kind, key)] += 1
        finally:
            self.sweep()
        if kind == "read":
            self._start_sweeper()
        return _Held(self, [(kind, key) for (_, key), _limit in keys])

    def _check_documents(self, tab: str, visitor: str) -> None:
        """Raises ``CapReached`` when a read into ``tab`` would hold one document more than the totals allow (its
        own document is replaced, so it does not count). Under the lock."""
        holding = [held for key, held in self._tabs.items() if key != tab and self._holds(key, held)]
        total, mine = self.limits.documents_total, self.limits.documents_per_visitor
        if total is not None and len(holding) >= total:
            idle = self.limits.idle_seconds
            raise CapReached(f"the app holds at most {total} visitors' documents in memory at once and holds {total} "
                             "now; try again later" + (f" (a tab idle for {_minutes(idle)} has its document freed)"
                                                       if idle is not None else ""))
        if mine is not None and sum(held.visitor == visitor for held in holding) >= mine:
            raise CapReached(f"each visitor may hold at most {mine} document{'s' if mine != 1 else ''} in memory "
                             f"at once and you hold {mine} in your other tabs; press “Clear documents” in one or "
                             "close it")

    def _holds(self, key: str, held: _Tab) -> bool:
        """Whether the tab holds a document in memory now, or is reading one."""
        state = held.state
        if getattr(state, "is_closed", False):
            return False
        has_document = getattr(state, "read_text", None) is not None and getattr(state, "session", None) is not None
        return has_document or self._held[("read", key)] > 0

    def sweep(self) -> int:
        """Frees the document of every tab idle (no event) for more than ``idle_seconds`` and not busy, its shelf
        copy kept (``saved_key`` reopens it); forgets tabs that hold nothing. Returns how many were freed."""
        idle_after, now = self.limits.idle_seconds, self.clock()
        with self._lock:
            for key in [key for key, held in self._tabs.items() if not self._holds(key, held)]:
                del self._tabs[key]
            idle = [] if idle_after is None else [
                (key, held.state) for key, held in self._tabs.items()
                if now - held.last_event > idle_after and not getattr(held.state, "is_busy", False)
                and self._held[("read", key)] == 0]
            for key, _state in idle:
                del self._tabs[key]
        for _key, state in idle:
            try:
                if state.session is not None:
                    state.session.clear()
                state.read_text = None
            except Exception:  # one tab's failure must not keep the others' memory
                logger.exception("could not free an idle tab's document")
        if idle:
            logger.info("freed the documents of %d visitor tab(s) idle for over %s", len(idle), _minutes(idle_after))
        return len(idle)

    def _start_sweeper(self) -> None:
        """The daemon thread that frees idle tabs when no event comes (started with the first read)."""
        if self._sweep_every is None or self.limits.idle_seconds is None or self._sweeper is not None:
            return
        with self._lock:
            if self._sweeper is not None:
                return
            self._sweeper = threading.Thread(target=self._sweep_forever, name="idle-tabs", daemon=True)
        self._sweeper.start()

    def _sweep_forever(self) -> None:
        while True:
            time.sleep(self._sweep_every)
            try:
                self.sweep()
            except Exception:  # the thread must outlive one bad sweep
                logger.exception("the idle-tab check failed")

    def _release(self, held: list[tuple[str, str]]) -> None:
        with self._lock:
            for item in held:
                self._held[item] -= 1
                if self._held[item] <= 0:
                    del self._held[item]

    def choose_files(self, state, request, files: Iterable[str]) -> None:
        """The tab now holds ``files`` (and its earlier uploads): raises ``CapReached`` when the visitor's tabs
        would hold more than ``upload_bytes`` together (the tab's count is then left as it was)."""
        limit = self.limits.upload_bytes
        if limit is None:
            return
        from engine import format_bytes  # here: launch.py reads CapLimits for --help before torch may load

        visitor, tab = _visitor(request, state), _tab(request, state)
        size = sum(_size(path) for path in set(files))
        with self._lock:
            tabs = self._files.setdefault(visitor, {})
            others = sum(held for key, held in tabs.items() if key != tab)
            if others + size > limit:
                raise CapReached(
                    f"these files take {format_bytes(size)} and each visitor may hold at most {format_bytes(limit)} "
                    f"of files at once" + (f" ({format_bytes(others)} of it in your other tabs)" if others else "")
                    + "; choose fewer or smaller files, or close another tab")
            tabs[tab] = size

    def tab_closed(self, session_hash: str, username: str | None = None) -> None:
        """A tab went away: its files and document no longer count."""
        with self._lock:
            self._tabs.pop(f"tab:{session_hash}", None)
            for visitor in (f"user:{username}" if username else None, f"session:{session_hash}"):
                tabs = self._files.get(visitor) if visitor else None
                if tabs is not None:
                    tabs.pop(f"tab:{session_hash}", None)
                    if not tabs:
                        del self._files[visitor]

    def _keys(self, kind: str, state, request) -> list[tuple[tuple[str, str], int | None]]:
        limits = self.limits
        per = {"question": (limits.questions_per_tab, limits.questions_per_visitor, limits.questions_per_address),
               "read": (None, limits.reads_per_visitor, limits.reads_per_address)}[kind]
        keys = [(("tab", _tab(request, state)), per[0]), (("visitor", _visitor(request, state)), per[1])]
        address = _address(request)
        if address is not None:
            keys.append((("address", f"address:{address}"), per[2]))
        if kind == "read" and limits.reads_total is not None:
            keys.append((("all", "all"), limits.reads_total))
        # The tab's read count is kept though uncapped: it says which tabs are reading (``_holds``).
        return [key for key in keys if key[1] is not None or key[0][0] in ("tab", "visitor")]


def _refusal(kind: str, scope: str, limit: int) -> str:
    one, many, doing = _WHAT[kind]
    if scope == "tab":
        return f"this tab already has a {one} {doing}; wait for its end or press Stop (one {one} at a time per tab)"
    count = f"{limit} {one if limit == 1 else many}"
    if scope == "visitor":
        return (f"each visitor may have at most {count} {doing} at once and you already have {limit}; "
                "wait for one to end")
    if scope == "all":
        return (f"the app runs at most {limit} of all its visitors' {many} at once and {limit} are {doing}; wait "
                "for one to end")
    return (f"each address may have at most {count} {doing} at once, and {limit} come from yours; wait for one "
            "to end")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} minutes"


def _tab(request, state) -> str:
    session = getattr(request, "session_hash", None)
    return f"tab:{session}" if session else f"tab:{id(state)}"


def _visitor(request, state) -> str:
    username = getattr(request, "username", None)
    if username:
        return f"user:{username}"
    session = getattr(request, "session_hash", None)
    return f"session:{session}" if session else f"session:{id(state)}"


def _address(request) -> str | None:
    client = getattr(request, "client", None)
    host = getattr(client, "host", None)
    if not host:
        return None
    try:
        return None if ipaddress.ip_address(host).is_loopback else host
    except ValueError:
        return None if host in ("localhost", "testclient") else host


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
