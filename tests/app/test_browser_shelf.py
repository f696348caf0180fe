"""A visitor kept apart without a login keeps one shelf per browser (``app.browser_id``, ``app.saved.shelves``): a reload
(its tab closes, a new one opens with a new session hash) finds the saved documents again; another browser, a made-up
id or a client without one gets a shelf of its own; the shelf goes once the browser has had no tab open for the
grace time."""

from __future__ import annotations

import time

import gradio as gr
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from app.saved import shelves as shelves_module
from app.browser_id import COOKIE, BrowserIdCookie, browser_id
from app.saved.shelves import Shelves
from engine import SnapshotStore

ALICE = "A" * 20 + "b-c_" + "d" * 19  # 43 characters, as secrets.token_urlsafe(32) makes them
BOB = "B" * 43


def _request(session_hash: str, cookie: str | None = None) -> gr.Request:
    headers = [(b"cookie", f"{COOKIE}={cookie}".encode())] if cookie is not None else []
    scope = {"type": "http", "method": "POST", "path": "/gradio_api/queue/join", "headers": headers,
             "query_string": b"", "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 7860)}
    return gr.Request(request=Request(scope), session_hash=session_hash)


@pytest.fixture
def shelves(tmp_path):
    return Shelves(SnapshotStore(tmp_path / "kv"), private=True, session_root=tmp_path / "visitors")


def _keep(shelf) -> None:
    """Something on the shelf's disk, as a saved document would be."""
    (shelf.store.root / "saved.bin").write_bytes(b"kv")


def test_a_reload_finds_the_browsers_shelf_and_other_browsers_do_not(shelves, monkeypatch):
    monkeypatch.setattr(shelves_module, "BROWSER_GRACE_SECONDS", 60.0)
    first = shelves.for_request(_request("tab-1", ALICE))
    _keep(first)
    shelves.close_session("tab-1")  # the reload closes the old tab...
    again = shelves.for_request(_request("tab-2", ALICE))  # ...and the new one, with a new hash, has its shelf
    assert again.store.root == first.store.root and (again.store.root / "saved.bin").exists()
    for other in (_request("tab-3", BOB), _request("tab-4"), _request("tab-5", "not-an-id"),
                  _request("tab-6", ALICE[:-1])):
        assert shelves.for_request(other).store.root != first.store.root
    shelves.close_session("tab-2")
    assert (first.store.root / "saved.bin").exists()  # within the grace time


def test_a_browsers_shelf_goes_after_its_last_tab_and_a_tabs_own_at_once(shelves, monkeypatch):
    monkeypatch.setattr(shelves_module, "BROWSER_GRACE_SECONDS", 0.3)
    browser = shelves.for_request(_request("tab-1", ALICE))
    shelves.for_request(_request("tab-2", ALICE))  # two tabs of one browser
    tab_only = shelves.for_request(_request("tab-3"))  # a client without an id: the tab's own shelf
    _keep(browser)
    _keep(tab_only)
    shelves.close_session("tab-3")
    assert not tab_only.store.root.exists()
    shelves.close_session("tab-1")
    time.sleep(0.6)
    assert browser.store.root.exists()  # tab-2 is still open
    shelves.close_session("tab-2")
    deadline = time.monotonic() + 10
    while browser.store.root.exists():
        assert time.monotonic() < deadline, "the browser's shelf outlived its grace time"
        time.sleep(0.05)
    # A tab coming back within the grace time keeps it: the deletion is called off.
    kept = shelves.for_request(_request("tab-7", BOB))
    _keep(kept)
    shelves.close_session("tab-7")
    shelves.for_request(_request("tab-8", BOB))
    time.sleep(0.6)
    assert (kept.store.root / "saved.bin").exists()


def test_the_page_sets_an_httponly_id_once_and_nothing_else_gets_one():
    inner = Starlette(routes=[Route("/", lambda request: HTMLResponse("<html></html>")),
                              Route("/config", lambda request: JSONResponse({}))])
    client = TestClient(BrowserIdCookie(inner))
    page = client.get("/")
    cookie = page.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=") and "HttpOnly" in cookie and "SameSite=Lax" in cookie
    assert "Max-Age" not in cookie and "expires" not in cookie.lower()  # gone when the browser closes
    sent = client.cookies.get(COOKIE)
    assert browser_id(Request({"type": "http", "headers": [(b"cookie", f"{COOKIE}={sent}".encode())]})) == sent
    assert "set-cookie" not in client.get("/").headers  # sent back: kept
    assert "set-cookie" not in TestClient(BrowserIdCookie(inner)).get("/config").headers  # no page, no id
    made_up = TestClient(BrowserIdCookie(inner), cookies={COOKIE: "x"}).get("/")
    assert made_up.headers["set-cookie"].startswith(f"{COOKIE}=")  # a malformed one is replaced
