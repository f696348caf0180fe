"""Per-visitor caps, so that one visitor cannot take a shared app for themselves: questions asked or waiting, reads
in flight, bytes of chosen files, and (in ``app.shelves``) the disk their saved documents take.

A visitor is the logged-in user with ``--auth-file``, else the browser session; a visitor's tab is its session. A
client address that is not loopback counts too (someone opening many sessions from one machine); through the share
tunnel every visitor arrives from loopback, so there the address says nothing and is left out. Each refusal is a
``CapReached`` whose message says which cap and what to do. Nothing here runs when only the owner can reach the app
(``NO_CAPS``).
"""

from __future__ import annotations

import collections
import ipaddress
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass


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


NO_CAPS = CapLimits(None, None, None, None, None, None, None)  # the owner alone: the app as it always was


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


class VisitorCaps:
    """What each visitor holds now. Thread-safe: handlers of different tabs run on Gradio's worker threads."""

    def __init__(self, limits: CapLimits = NO_CAPS):
        self.limits = limits
        self._lock = threading.Lock()
        self._held: collections.Counter[tuple[str, str]] = collections.Counter()
        self._files: dict[str, dict[str, int]] = {}  # visitor -> tab -> bytes of the tab's files

    def take(self, kind: str, state, request) -> _Held:
        """One ``kind`` ("question" or "read") for the visitor behind ``request``, held until the returned
        context manager's block ends (``with caps.take(...):``); raises ``CapReached`` when they are at a cap."""
        keys = self._keys(kind, state, request)
        with self._lock:
            for (scope, key), limit in keys:
                if limit is not None and self._held[(kind, key)] >= limit:
                    raise CapReached(_refusal(kind, scope, limit))
            for (_, key), _limit in keys:
                self._held[(kind, key)] += 1
        return _Held(self, [(kind, key) for (_, key), _limit in keys])

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
        """A tab went away: its files no longer count."""
        with self._lock:
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
        return [key for key in keys if key[1] is not None or key[0][0] == "visitor"]


def _refusal(kind: str, scope: str, limit: int) -> str:
    one, many, doing = _WHAT[kind]
    if scope == "tab":
        return f"this tab already has a {one} {doing}; wait for its end or press Stop (one {one} at a time per tab)"
    count = f"{limit} {one if limit == 1 else many}"
    if scope == "visitor":
        return (f"each visitor may have at most {count} {doing} at once and you already have {limit}; "
                "wait for one to end")
    return (f"each address may have at most {count} {doing} at once, and {limit} come from yours; wait for one "
            "to end")


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
