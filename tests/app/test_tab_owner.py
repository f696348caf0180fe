"""A tab's state answers only the login that first used it (``app.tab_owner``): Gradio finds a tab's state by its
session hash alone, so with ``--auth-file`` bob, sending alice's hash, could ask of her document, stop or clear her
tab, and an unauthenticated ``/heartbeat/{hash}`` dropped freed her document and deleted her uploads."""

from __future__ import annotations

import gradio as gr
import pytest
from starlette.requests import Request

from app.browser_state import BrowserState
from app.handlers import Handlers
from app.tab_owner import NOT_YOURS


def _request(username: str | None, session_hash: str = "alice-tab") -> gr.Request:
    """A ``gr.Request`` as Gradio makes one for a handler: around the HTTP call's starlette ``Request``, with the
    login's username (None without a login)."""
    scope = {"type": "http", "method": "POST", "path": "/gradio_api/queue/join", "headers": [],
             "query_string": b"", "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 7860)}
    return gr.Request(request=Request(scope), username=username, session_hash=session_hash)


def test_another_logins_request_on_a_tab_is_refused_and_changes_nothing():
    handlers = Handlers(lambda: None)
    state = BrowserState()
    handlers.tab_memory(state, request=_request("alice"))  # alice's first event binds her tab
    with pytest.raises(gr.Error, match=NOT_YOURS):
        handlers.stop(state, _request("bob"))
    assert state.stop_requested is False
    with pytest.raises(gr.Error, match=NOT_YOURS):
        handlers.cancel(state, _request("bob"))
    assert state.cancel_requested is False
    with pytest.raises(gr.Error, match=NOT_YOURS):  # a generator: refused on its first step, before any work
        list(handlers.ask("What is the code?", [], 32, 0.0, state, True, True, _request("bob")))
    with pytest.raises(gr.Error, match=NOT_YOURS):
        handlers.tab_memory(state, request=_request(None))  # no login is not alice either
    handlers.stop(state, _request("alice"))
    assert state.stop_requested is True


def test_the_wrapped_handlers_still_get_gradios_request():
    """Gradio passes a ``gr.Request`` only to a parameter hinted as one: every wrapped handler has it."""
    from gradio.helpers import special_args

    handlers = Handlers(lambda: None)
    request = _request("alice")
    for name in ("stop", "cancel", "clear", "ask", "read", "tab_memory", "show_page"):
        inputs, _, _, _ = special_args(getattr(handlers, name), [None] * 8, request)
        assert request in inputs, name


def test_without_a_login_every_tab_works_as_before():
    handlers = Handlers(lambda: None)
    state = BrowserState()
    handlers.stop(state, _request(None))
    handlers.cancel(state, _request(None, "another-tab"))  # the same None login: no login, no owner to differ
    assert state.stop_requested and state.cancel_requested


@pytest.mark.slow
def test_bob_cannot_read_stop_clear_or_close_alices_tab(embedded_model, secret_pdf, tmp_path):
    from engine import DocumentSession, OffloadPolicy

    model, tokenizer = embedded_model
    uploads = tmp_path / "uploads"
    (uploads / "x").mkdir(parents=True)
    upload = uploads / "x" / "lighthouse.pdf"
    upload.write_bytes(open(secret_pdf, "rb").read())
    handlers = Handlers(lambda: DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=64)), upload_dir=uploads)
    alice, bob = _request("alice"), _request("bob")  # bob sends alice's session hash
    state = BrowserState()
    handlers.choose_files([str(upload)], state, alice)
    state.uploads.add(str(upload))
    list(handlers.read(False, state, alice))
    assert state.session.is_prefilled
    with pytest.raises(gr.Error, match=NOT_YOURS):
        list(handlers.ask("What is the secret launch code?", [], 16, 0.0, state, True, True, bob))
    with pytest.raises(gr.Error, match=NOT_YOURS):
        handlers.clear(state, bob)
    with pytest.raises(gr.Error, match=NOT_YOURS):
        handlers.show_page("3", state, bob)  # the page viewer would show her page's text
    handlers.unload(bob)  # bob's dropped heartbeat for her hash: ignored
    assert state.session.is_prefilled and not state.is_closed and upload.exists()
    assert handlers.app.tabs["alice-tab"] is state
    views = list(handlers.ask("What is the secret launch code?", [], 16, 0.0, state, True, True, alice))
    assert views[-1].chat[-1]["role"] == "assistant" and views[-1].chat[-1]["content"] not in ("…", "")
    handlers.unload(alice)  # her own tab closing frees it and deletes her upload
    assert state.is_closed and not state.session.is_prefilled and not upload.exists()


def test_every_event_of_the_page_that_takes_a_tabs_state_refuses_another_login():
    """Not only ``Handlers``' methods: the page's own functions (the clear button's stop of the read and the answer,
    the timer's plan refresh and model-switch check) are Gradio events too, reachable by fn_index with any session
    hash; each one refuses bob on alice's tab before it does anything."""
    import inspect

    from gradio.helpers import special_args

    from app.ui import build_ui

    demo = build_ui(lambda: None, model_info=lambda: {"serial": 1})  # a served model the picker may switch
    state = BrowserState()
    Handlers(lambda: None).tab_memory(state, request=_request("alice"))  # alice's tab
    checked = []
    for block_fn in demo.fns.values():
        if block_fn.fn is None or not any(isinstance(block, gr.State) for block in block_fn.inputs):
            continue
        inputs = [state if isinstance(block, gr.State) else None for block in block_fn.inputs]
        inputs, _, _, _ = special_args(block_fn.fn, inputs, _request("bob"))
        with pytest.raises(gr.Error, match=NOT_YOURS):
            result = block_fn.fn(*inputs)
            if inspect.isgenerator(result):
                next(result)
        checked.append(block_fn.name)
    assert {"_stop_all", "refreshed_plan", "model_changed"} <= set(checked), checked
    assert not state.cancel_requested and not state.stop_requested  # bob's clear stopped nothing of hers
