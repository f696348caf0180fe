"""Per-visitor caps (issue 54) through the real handlers: questions asked or waiting per tab, per person and per
address, reads in flight, bytes of chosen files and of saved documents, each refusal saying why."""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr
import pytest

from app.browser_state import BrowserState
from app.handlers import Handlers
from app.saved.saved_docs import SavedDocs
from app.saved.shelves import Shelves
from app.visitor_caps import NO_CAPS, CapLimits, CapReached, VisitorCaps
from engine import SnapshotStore
from engine.types import AnswerChunk


class _Session:
    """A read session whose answer streams until the test has seen enough (the caps are what is tested)."""

    is_prefilled = True
    document, dropped_turns, document_tokens = "", 0, 0

    def fit_question(self, question, max_new_tokens):
        return SimpleNamespace(num_dropped=0, ids=question.split())

    def count_tokens(self, text):
        return len(text.split())

    def question_room(self, max_new_tokens):
        return 10_000

    @property
    def read_time(self):
        return self

    def estimate_prefill_seconds(self, num_tokens, start=0):
        return 0.0

    def conversation(self):  # the turns it recorded: none (the app keeps a turn's notes only for recorded turns)
        return []

    def ask(self, question, **kwargs):
        yield AnswerChunk("It", "It", 1, 0.1, 10.0, done=False)
        yield AnswerChunk("It is.", " is.", 2, 0.1, 10.0, done=True)


def _tab(session_hash: str, username: str | None = None, host: str = "127.0.0.1"):
    request = gr.Request(username=username, session_hash=session_hash, client={"host": host})
    return BrowserState(session=_Session()), request


def _asking(handlers: Handlers, state: BrowserState, request):
    """An ask that has started (it holds its place) and waits to be stepped on."""
    views = handlers.ask("What is it?", [], 16, 0.0, state, request=request)
    next(views)
    return views


def _status(views) -> str:
    return list(views)[-1].status


def test_one_question_at_a_time_per_tab():
    handlers = Handlers(lambda: None, private=True)
    state, request = _tab("tab-1")
    running = _asking(handlers, state, request)
    line = _status(handlers.ask("And then?", [], 16, 0.0, state, request=request))
    assert "Not asked: this tab already has a question asked or waiting" in line and "press Stop" in line
    list(running)  # its answer ends: the tab may ask again
    assert "It is." in list(handlers.ask("And then?", [], 16, 0.0, state, request=request))[-1].chat[-1]["content"]


def test_a_person_with_many_tabs_and_an_address_with_many_sessions_are_capped():
    handlers = Handlers(lambda: None, private=True, caps=CapLimits(questions_per_visitor=2, questions_per_address=3))
    ada = [_tab(f"ada-{n}", "ada") for n in range(3)]
    held = [_asking(handlers, *ada[0]), _asking(handlers, *ada[1])]
    line = _status(handlers.ask("Q", [], 16, 0.0, *ada[2][:1], request=ada[2][1]))
    assert "each visitor may have at most 2 questions asked or waiting for an answer at once" in line
    bob = _tab("bob-1", "bob")
    held.append(_asking(handlers, *bob))  # another person: not ada's cap
    # Three sessions from one outside address (no login: each session is a visitor of its own).
    outside = [_tab(f"s-{n}", host="203.0.113.7") for n in range(4)]
    held += [_asking(handlers, *tab) for tab in outside[:3]]
    line = _status(handlers.ask("Q", [], 16, 0.0, outside[3][0], request=outside[3][1]))
    assert "each address may have at most 3 questions" in line and "come from yours" in line
    for views in held:
        views.close()  # a closed page: the places are given back
    assert "It is." in list(handlers.ask("Q", [], 16, 0.0, outside[3][0],
                                         request=outside[3][1]))[-1].chat[-1]["content"]


def test_through_the_share_tunnel_the_address_is_not_a_visitor():
    caps = VisitorCaps(CapLimits(questions_per_address=1))
    first, second = _tab("s-1"), _tab("s-2")  # both from loopback, as every visitor through the tunnel
    with caps.take("question", *first), caps.take("question", *second):
        pass


def test_one_read_in_flight_per_visitor():
    handlers = Handlers(lambda: None, private=True)
    state, request = _tab("ada-2", "ada")
    with handlers.app.caps.take("read", BrowserState(), gr.Request(username="ada", session_hash="ada-1")):
        line = _status(handlers.read(False, state, request))
    assert "Not read: each visitor may have at most 1 read running or waiting at once" in line
    assert "Drop one or more files first" in _status(handlers.read(False, state, request))  # its read ended


def test_chosen_files_past_the_visitors_bytes_are_refused_and_deleted(tmp_path):
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    handlers = Handlers(lambda: None, private=True, upload_dir=uploads, caps=CapLimits(upload_bytes=1000))
    small, large = uploads / "small.txt", uploads / "large.txt"
    small.write_bytes(b"x" * 600)
    large.write_bytes(b"x" * 600)
    first, first_request = _tab("ada-1", "ada")
    handlers.app.caps.choose_files(first, first_request, [str(small)])  # what ada's first tab holds
    second, second_request = _tab("ada-2", "ada")
    view = handlers.choose_files([str(large)], second, second_request)
    assert "Not taken: these files take 600 B and each visitor may hold at most 1000 B of files at once" in view.status
    assert "600 B of it in your other tabs" in view.status and "600 B" in view.plan
    assert not large.exists() and small.exists() and not second.uploads  # the refused file is gone at once
    handlers.unload(first_request)  # her first tab closes: its files no longer count
    handlers.app.caps.choose_files(second, second_request, [str(small)])


def test_the_owner_alone_has_no_caps():
    handlers = Handlers(lambda: None)  # not private: the app as it always was
    assert handlers.app.caps.limits == NO_CAPS
    state, request = _tab("tab-1")
    running = _asking(handlers, state, request)
    second = handlers.ask("Q", [], 16, 0.0, state, request=request)  # the same tab, again: in line, not refused
    assert "Waiting for the compute device" in next(second).status
    second.close()
    running.close()


def test_a_visitors_shelf_holds_at_most_its_cap_and_a_save_past_it_says_so(tmp_path):
    store = SnapshotStore(tmp_path / "kv", max_bytes=10 * 2**20)
    shelves = Shelves(store, private=True, visitor_bytes=2**20)
    ada = shelves.for_request(gr.Request(username="ada", session_hash="s"))
    assert ada.store.max_bytes == 2**20 and ada.store.root != store.root

    class _Big:
        document = "text"

        def save_snapshot(self, store, label, **kwargs):  # what SnapshotStore.save answers for a snapshot over its cap
            return None

    kind, sentence = ada.save(_Big(), "big book")
    assert kind == "warn" and "more than the 1.00 MiB each visitor may keep" in sentence
    tighter = Shelves(SnapshotStore(tmp_path / "kv2", max_bytes=2**19), private=True, visitor_bytes=2**20)
    shelf = tighter.for_request(gr.Request(username="ada", session_hash="s"))
    assert shelf.store.max_bytes == 2**19 and shelf.cap_note == "allowed for saved documents"
    assert Shelves(store).for_request(None).store.max_bytes == 10 * 2**20  # the owner's shelf: the store's cap
    assert isinstance(Shelves(None, private=True).for_request(None), SavedDocs)


def test_caps_refuse_with_the_exception_the_handlers_catch():
    caps = VisitorCaps(CapLimits(reads_per_visitor=1))
    state, request = _tab("t", "ada")
    with caps.take("read", state, request), pytest.raises(CapReached):
        caps.take("read", BrowserState(), gr.Request(username="ada", session_hash="u"))
    with caps.take("read", state, request):  # given back when the block ended
        pass
