"""Caps over all visitors together (issue 54): without a login the client picks its session_hash, so one client can
be any number of visitors; the totals of reads in flight, documents held in memory and shelf bytes bound them
whatever the hashes, and a tab idle with a document (one that never opens the heartbeat) has it freed."""

from __future__ import annotations

import contextlib
import time

import gradio as gr
import pytest

from app.browser_state import BrowserState
from app.handlers import Handlers
from app.saved.shelves import Shelves
from app.visitor_caps import NO_CAPS, CapLimits, CapReached, VisitorCaps
from engine import SnapshotStore, format_bytes


class _Holding:
    """A tab's session after a read: it holds a document until cleared (what the idle check frees)."""

    def __init__(self):
        self.cleared = 0

    def clear(self):
        self.cleared += 1


def _tab(session_hash: str, username: str | None = None) -> tuple[BrowserState, gr.Request]:
    # Loopback, as every visitor through the share tunnel: the per-address cap says nothing there.
    return BrowserState(session=_Holding()), gr.Request(username=username, session_hash=session_hash,
                                                        client={"host": "127.0.0.1"})


def _read_into(caps: VisitorCaps, state: BrowserState, request) -> None:
    """A read through the caps that ends holding its document, as ``Reading.read`` leaves the tab."""
    with caps.take("read", state, request):
        state.read_text = "the document"


def _status(views) -> str:
    return list(views)[-1].status


def test_made_up_session_hashes_cannot_run_more_reads_than_the_total():
    caps = VisitorCaps(CapLimits(reads_total=2), sweep_every=None)
    with contextlib.ExitStack() as held:
        for n in range(2):
            held.enter_context(caps.take("read", *_tab(f"made-up-{n}")))
        with pytest.raises(CapReached, match="the app runs at most 2 of all its visitors' reads at once"):
            caps.take("read", *_tab("made-up-2"))
    caps.take("read", *_tab("made-up-3")).__exit__(None, None, None)  # given back: a read may start again


def test_the_reads_total_through_the_real_read_handler():
    handlers = Handlers(lambda: None, private=True, caps=CapLimits(reads_total=2))
    with handlers.app.caps.take("read", *_tab("a")), handlers.app.caps.take("read", *_tab("b")):
        line = _status(handlers.read(False, *_tab("c")))
    assert "Not read: the app runs at most 2 of all its visitors&#x27; reads at once and 2 are running" in line
    assert "Drop one or more files first" in _status(handlers.read(False, *_tab("c")))  # they ended


def test_made_up_session_hashes_cannot_hold_more_documents_than_the_total():
    caps = VisitorCaps(CapLimits(documents_total=4), sweep_every=None)
    tabs = [_tab(f"made-up-{n}") for n in range(5)]
    for tab in tabs[:4]:
        _read_into(caps, *tab)
    with pytest.raises(CapReached, match="the app holds at most 4 visitors' documents in memory at once"):
        caps.take("read", *tabs[4])
    _read_into(caps, *tabs[0])  # a tab reading again replaces its own document: not refused
    tabs[1][0].close()  # "Clear documents" frees one: a new read may hold it
    _read_into(caps, *tabs[4])
    caps.tab_closed("made-up-2")  # a closed tab no longer holds one either
    _read_into(caps, *_tab("made-up-5"))


def test_one_user_holds_at_most_their_documents_in_however_many_tabs():
    caps = VisitorCaps(CapLimits(documents_per_visitor=2), sweep_every=None)
    for n in range(2):
        _read_into(caps, *_tab(f"ada-{n}", "ada"))
    with pytest.raises(CapReached, match="each visitor may hold at most 2 documents in memory at once"):
        caps.take("read", *_tab("ada-2", "ada"))
    _read_into(caps, *_tab("bob-0", "bob"))  # another person


def test_a_tab_idle_past_its_time_has_its_document_freed_and_its_shelf_copy_kept():
    now = [0.0]
    caps = VisitorCaps(CapLimits(idle_seconds=30 * 60), clock=lambda: now[0], sweep_every=None)
    idle, busy, active = _tab("never-heartbeats"), _tab("answering"), _tab("asking")
    for tab in (idle, busy, active):
        _read_into(caps, *tab)
    idle[0].saved_key = "its-shelf-copy"
    now[0] = 20 * 60
    caps.take("question", *active).__exit__(None, None, None)  # an event: this tab is not idle
    busy[0].is_busy = True
    assert caps.sweep() == 0  # 20 minutes: nothing freed yet
    now[0] = 31 * 60
    assert caps.sweep() == 1
    assert idle[0].session.cleared == 1 and idle[0].read_text is None and idle[0].saved_key == "its-shelf-copy"
    assert busy[0].session.cleared == 0 and active[0].session.cleared == 0
    now[0] = 51 * 60
    caps.take("question", *_tab("someone")).__exit__(None, None, None)  # any event checks, no thread needed
    assert active[0].session.cleared == 1 and busy[0].session.cleared == 0


def test_the_idle_check_runs_on_its_own_thread_when_no_event_comes():
    now = [0.0]
    caps = VisitorCaps(CapLimits(idle_seconds=60), clock=lambda: now[0], sweep_every=0.01)
    state, request = _tab("never-heartbeats")
    _read_into(caps, state, request)
    now[0] = 120
    for _ in range(500):
        if state.session.cleared:
            break
        time.sleep(0.01)
    assert state.session.cleared == 1


def test_the_owner_alone_has_no_totals():
    caps = VisitorCaps(NO_CAPS)
    with contextlib.ExitStack() as held:
        for n in range(10):
            held.enter_context(caps.take("read", *_tab(f"t-{n}")))


def _snapshot(store: SnapshotStore, key: str, size: int) -> None:
    """A saved document of ``size`` bytes as the store lays it out (a folder per snapshot)."""
    folder = store.root / key
    folder.mkdir(parents=True)
    (folder / "kv.bin").write_bytes(b"x" * size)


def test_all_visitors_shelves_together_stay_within_the_total_and_a_save_past_it_says_so(tmp_path):
    store = SnapshotStore(tmp_path / "kv", max_bytes=10 * 2**20)
    shelves = Shelves(store, private=True, session_root=tmp_path / "sessions", visitor_bytes=2**20,
                      total_bytes=3 * 2**19)
    assert shelves.total_bytes == 3 * 2**19
    first = shelves.for_request(gr.Request(session_hash="made-up-1"))
    _snapshot(first.store, "a" * 16, 2**20)  # the first made-up session fills its own cap
    second = shelves.for_request(gr.Request(session_hash="made-up-2"))
    room = second.store.max_bytes
    assert 2**19 - 64 <= room <= 2**19  # what the first left of the total (less its owner file), not a fresh 1 MiB
    assert second.cap_note == "left of the 1.50 MiB all visitors may keep together"
    saved = list((tmp_path / "sessions").rglob("*"))

    class _Big:
        document = "text"

        def save_snapshot(self, store, label, **kwargs):  # what SnapshotStore.save answers past its cap
            assert store.max_bytes == room
            return None

    kind, sentence = second.save(_Big(), "big book")
    assert kind == "warn"
    assert f"more than the {format_bytes(room)} left of the 1.50 MiB all visitors may keep together" in sentence
    assert list((tmp_path / "sessions").rglob("*")) == saved  # nothing half-written
    shelves.close_session("made-up-1")  # the first tab closes: its room comes back
    assert shelves.for_request(gr.Request(session_hash="made-up-2")).store.max_bytes == 2**20


def test_the_shelves_total_is_within_the_stores_cap(tmp_path):
    shelves = Shelves(SnapshotStore(tmp_path / "kv", max_bytes=2**20), private=True, session_root=tmp_path / "s")
    assert shelves.total_bytes == 2**20  # the default total (16 GiB) is more than the store allows
    assert Shelves(SnapshotStore(tmp_path / "kv2"), private=True).total_bytes == CapLimits.shelves_total_bytes


def test_the_start_up_line_states_the_visitors_shelf_caps_not_no_size_limit(tmp_path):
    from app import startup

    uncapped = SnapshotStore(tmp_path / "kv")  # --snapshot-max none: the visitors' caps still bind
    line = startup.where_saved(uncapped, private=True, has_auth=False, session_shelves=tmp_path / "tabs")
    assert "no size limit" not in line
    assert "(at most 4.00 GiB each), at most 16.00 GiB all together" in line
    per_user = startup.where_saved(uncapped, private=True, has_auth=True, session_shelves=None,
                                  limits=CapLimits(shelf_bytes=2**30, shelves_total_bytes=3 * 2**30))
    assert "(at most 1.00 GiB each), at most 3.00 GiB all together" in per_user
    assert "(no size limit)" in startup.where_saved(uncapped, private=False, has_auth=False, session_shelves=None)
