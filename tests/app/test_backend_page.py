"""The ``--backend`` page shared (``--share``, logins): two browsers, simulated as Gradio hands a handler its
``gr.Request`` (the browser's id cookie, the session hash, the login), over an in-process OpenAI-compatible server
(httpx's transport: the backend is not what is tested here; ``test_backend.py`` runs a real one).

Before: any client sending a tab's session hash continued, stopped or cleared its conversation; every question went
to the backend at once, however many visitors asked; a proxy's HTML error page reached the chat as its markup."""

from __future__ import annotations

import secrets
import threading
import time

import gradio as gr
import httpx
import pytest
from simulated_backend import SimulatedBackend
from starlette.requests import Request

from app.backend_client import BackendClient
from app.backend_page import BackendPage, BackendTab
from app.browser_id import COOKIE
from app.tab_owner import NOT_YOURS
from app.visitor_caps import CapLimits

DOCUMENT = "=== notes.txt ===\nThe code is ORCHID-7."


def browser(session_hash: str, *, browser_id: str | None = None, username: str | None = None) -> gr.Request:
    """A ``gr.Request`` as Gradio makes one for a handler of the tab ``session_hash`` in the browser whose id cookie
    is ``browser_id`` (``app.browser_id``'s), from a visitor's address."""
    cookie = [(b"cookie", f"{COOKIE}={browser_id}".encode())] if browser_id else []
    scope = {"type": "http", "method": "POST", "path": "/gradio_api/queue/join", "headers": cookie,
             "query_string": b"", "client": ("203.0.113.7", 5000), "server": ("127.0.0.1", 7860)}
    return gr.Request(request=Request(scope), username=username, session_hash=session_hash)


@pytest.fixture
def backend():
    return SimulatedBackend()


@pytest.fixture
def page(backend):
    client = BackendClient("http://gpu-box:8000", transport=httpx.MockTransport(backend))
    return BackendPage(client, client.models(), caps=CapLimits())


def _read_tab(page: BackendPage, request: gr.Request, tmp_path) -> BackendTab:
    """A tab that has chosen a file and had the backend read it."""
    notes = tmp_path / f"notes-{request.session_hash}.txt"
    notes.write_text(DOCUMENT)
    state = page.choose([str(notes)], "team/model", BackendTab(), request)[0]
    *_, (state, progress, line, _chat) = page.read(None, None, "team/model", state, request)
    assert 'data-kind="ok"' in line, line
    return state


def _ask(page: BackendPage, state: BackendTab, request: gr.Request, question: str = "What is the code?") -> list:
    return list(page.ask(question, [], 32, 0.0, "team/model", state, request))


def test_another_browser_sending_a_tabs_hash_can_neither_ask_stop_nor_clear_it(page, backend, tmp_path):
    alice = browser("alice-tab", browser_id=secrets.token_urlsafe(32))
    mallory = browser("alice-tab", browser_id=secrets.token_urlsafe(32))  # the same hash, from another browser
    state = _read_tab(page, alice, tmp_path)
    assert _ask(page, state, alice)[-1][1][-1]["content"].startswith("The code is ORCHID-7.")
    chats = len(backend.chats)

    with pytest.raises(gr.Error, match=NOT_YOURS):  # continuing alice's conversation, which would show its turns
        _ask(page, state, mallory, "What did I ask before?")
    with pytest.raises(gr.Error, match=NOT_YOURS):
        page.stop(state, mallory)
    with pytest.raises(gr.Error, match=NOT_YOURS):
        page.new_chat(state, mallory)
    with pytest.raises(gr.Error, match=NOT_YOURS):
        list(page.read(None, None, "team/model", state, mallory))
    with pytest.raises(gr.Error, match=NOT_YOURS):
        page.choose([], "team/model", state, mallory)
    assert len(backend.chats) == chats and not state.stop_requested
    assert len(state.session.turns) == 1 and state.documents  # nothing was done to alice's tab
    page.unload(mallory)  # the heartbeat's unload of alice's hash, from mallory: ignored
    assert not state.is_closed and state.session.is_prefilled

    # Without an id cookie (a script) the hash alone is not alice's either; her own browser goes on.
    with pytest.raises(gr.Error, match=NOT_YOURS):
        page.stop(state, browser("alice-tab"))
    assert len(_ask(page, state, alice, "And again?")) > 1 and len(state.session.turns) == 2


def test_a_login_is_bound_too(page, tmp_path):
    same = secrets.token_urlsafe(32)  # one browser, two logins (a shared machine)
    state = _read_tab(page, browser("t", browser_id=same, username="ada"), tmp_path)
    with pytest.raises(gr.Error, match=NOT_YOURS):
        page.stop(state, browser("t", browser_id=same, username="bob"))


def test_questions_take_turns_at_the_backend_and_a_waiting_one_says_its_place(page, backend, tmp_path):
    ada, bob = (browser(name, browser_id=secrets.token_urlsafe(32)) for name in ("ada-tab", "bob-tab"))
    ada_tab, bob_tab = _read_tab(page, ada, tmp_path), _read_tab(page, bob, tmp_path)
    backend.hold.clear()  # ada's answer waits at its first word
    ada_answer = []
    asking = threading.Thread(target=lambda: ada_answer.extend(_ask(page, ada_tab, ada)))
    asking.start()
    deadline = time.monotonic() + 10
    while backend.running == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    bobs = page.ask("What is the code?", [], 32, 0.0, "team/model", bob_tab, bob)
    lines = [next(bobs)[3] for _ in range(2)]
    assert 'data-queue-position="1"' in lines[-1] and "1st in line" in lines[-1]  # bob waits, and is told so
    assert backend.running == 1  # before: both answers ran on the backend at once
    backend.hold.set()
    rest = list(bobs)
    asking.join(10)
    assert backend.most_running == 1
    assert ada_answer[-1][3].count("tok/s") and rest[-1][3].count("tok/s")  # both answered, one after the other


def test_a_tab_asks_one_question_at_a_time_and_stop_leaves_the_line(page, backend, tmp_path):
    ada, bob = (browser(name, browser_id=secrets.token_urlsafe(32)) for name in ("ada-tab", "bob-tab"))
    ada_tab, bob_tab = _read_tab(page, ada, tmp_path), _read_tab(page, bob, tmp_path)
    backend.hold.clear()
    first = page.ask("What is the code?", [], 32, 0.0, "team/model", ada_tab, ada)
    while backend.running == 0:
        next(first)
    second = _ask(page, ada_tab, ada, "And another?")  # the same tab again, while its first is answering
    assert "Not asked" in second[-1][3] and "one question at a time per tab" in second[-1][3]
    waiting = page.ask("What is the code?", [], 32, 0.0, "team/model", bob_tab, bob)
    next(waiting)
    page.stop(bob_tab, bob)  # bob leaves the line before his turn: nothing reaches the backend for him
    chats = len(backend.chats)
    assert "You left the queue" in list(waiting)[-1][3] and len(backend.chats) == chats
    backend.hold.set()
    list(first)


def test_documents_held_are_capped_across_visitors(backend, tmp_path):
    client = BackendClient("http://gpu-box:8000", transport=httpx.MockTransport(backend))
    page = BackendPage(client, client.models(), caps=CapLimits(documents_total=2))
    for name in ("a", "b"):
        _read_tab(page, browser(name, browser_id=secrets.token_urlsafe(32)), tmp_path)
    third = browser("c", browser_id=secrets.token_urlsafe(32))
    (tmp_path / "c.txt").write_text(DOCUMENT)
    state = page.choose([str(tmp_path / "c.txt")], "team/model", BackendTab(), third)[0]
    refused = list(page.read(None, None, "team/model", state, third))[-1]
    assert "Not read" in refused[2] and "holds at most 2 visitors" in refused[2] and not state.session.is_prefilled


def test_a_closed_tab_lets_go_of_its_documents_and_its_place(page, backend, tmp_path):
    ada = browser("ada-tab", browser_id=secrets.token_urlsafe(32))
    state = _read_tab(page, ada, tmp_path)
    page.unload(ada)
    assert state.is_closed and not state.session.is_prefilled and state.read_text is None
    assert "ada-tab" not in page.tabs


@pytest.mark.parametrize("failure", [
    httpx.Response(502, headers={"content-type": "text/html"}, text=(
        "<html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1>"
        "<img src=x onerror=alert(1)><script>alert(2)</script></body></html>")),
    httpx.Response(502, headers={"content-type": "text/html"}, text=(  # no title: its text, no script's
        "<html><body><script>alert(2)</script><h1>Bad Gateway</h1><img src=x onerror=alert(1)></body></html>")),
    httpx.Response(400, json={"error": {"message": "bad <img src=x onerror=alert(1)> ![t](http://tracker/p.png)"}}),
])
def test_a_backends_error_reaches_the_page_as_a_clear_message_never_its_markup(page, backend, tmp_path, failure):
    ada = browser("ada-tab", browser_id=secrets.token_urlsafe(32))
    state = _read_tab(page, ada, tmp_path)
    backend.failure = failure
    _, history, _, line = _ask(page, state, ada)[-1]
    said = history[-1]["content"]
    assert f"refused ({failure.status_code}" in line and "data-kind=\"error\"" in line
    for shown in (said, line):
        assert "<img" not in shown and "<script" not in shown
    assert "![" not in said  # an image in the chat's Markdown would make the browser fetch it: a plain link at most
    if failure.status_code == 502:  # the page's title, not its markup
        assert "Bad Gateway" in line and "alert" not in line and "&lt;" not in line


def test_an_error_event_mid_stream_is_said(page, backend, tmp_path):
    ada = browser("ada-tab", browser_id=secrets.token_urlsafe(32))
    state = _read_tab(page, ada, tmp_path)
    event = b'data: {"error": {"message": "CUDA out of memory", "code": 500}}\n\n'
    backend.failure = httpx.Response(200, headers={"content-type": "text/event-stream"}, content=event)
    _, history, _, line = _ask(page, state, ada)[-1]
    assert "CUDA out of memory" in line and "no answer" in history[-1]["content"]  # before: an empty answer, "ok"


@pytest.mark.parametrize("flags, capped", [([], False), (["--host", "0.0.0.0"], True), (["--share"], True)])
def test_the_launched_page_caps_visitors_exactly_when_others_can_reach_it(backend, flags, capped):
    """``--backend``'s start builds the page with the caps whenever others can reach it (and the caps flags' values),
    the owner alone uncapped: as the studio's own page."""
    from app.cli import build_parser
    from app.startup import backend_page
    from app.visitor_caps import NO_CAPS

    args = build_parser().parse_args(["--backend", "http://gpu-box:8000", "--visitor-questions", "3", *flags])
    client = BackendClient(args.backend, transport=httpx.MockTransport(backend))
    limits = backend_page(args, client, client.models(), None).backend_page.caps.limits
    assert limits == (CapLimits(questions_per_visitor=3) if capped else NO_CAPS)
