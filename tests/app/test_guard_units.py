"""``app.hosts`` and ``app.guard`` without the studio: which names and origins are the app's own, and the guard in
front of a real Starlette app (a WebSocket handshake from another site is refused too)."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from app.guard import RequestGuard
from app.hosts import AllowedHosts, origin_matches


def test_the_names_a_launch_answers_to():
    loopback = AllowedHosts.for_launch("127.0.0.1", share=False)
    assert loopback.allows("localhost:7860") and loopback.allows("[::1]:7860") and loopback.allows("127.0.0.1")
    assert not loopback.allows("evil.example") and not loopback.allows("x.gradio.live") and not loopback.allows("")
    named = AllowedHosts.for_launch("studio.lan", share=False)
    assert named.allows("studio.lan:7860") and named.allows("STUDIO.LAN") and not named.allows("studio.lan.evil.example")
    every = AllowedHosts.for_launch("0.0.0.0", share=False)
    assert every.allows(socket.gethostname()) and every.allows(f"{socket.gethostname()}.local:7860")
    # an address literal only where the connection arrived: rebinding needs a name, and this is none
    assert every.allows("192.168.1.20:7860", "192.168.1.20") and not every.allows("192.168.1.20", "10.0.0.5")
    assert every.allows("[fe80::1]:7860", "fe80::1%eth0")
    shared = AllowedHosts.for_launch("127.0.0.1", share=True)
    assert shared.allows("k3x9q2.gradio.live") and shared.allows("K3X9Q2.gradio.live:443")
    for other in ("gradio.live", "a.b.gradio.live", "x.gradio.live.evil.example", "xgradio.live"):
        assert not shared.allows(other), other


@pytest.mark.parametrize("origin, host, same", [
    ("http://127.0.0.1:7860", "127.0.0.1:7860", True),
    ("https://k3x9q2.gradio.live", "k3x9q2.gradio.live", True),
    ("https://k3x9q2.gradio.live", "k3x9q2.gradio.live:443", True),
    ("http://localhost:7860", "127.0.0.1:7860", False),  # another origin, though this machine too
    ("http://127.0.0.1:8000", "127.0.0.1:7860", False),  # another port: another local app
    ("https://evil.example", "127.0.0.1:7860", False),
    ("null", "127.0.0.1:7860", False),
    ("file:///tmp/x.html", "127.0.0.1:7860", False),
    ("http://127.0.0.1:7860/page?x=1", "127.0.0.1:7860", True),  # a Referer
])
def test_an_origin_is_the_apps_own_only_when_it_names_the_same_host_and_port(origin, host, same):
    assert origin_matches(origin, host) is same


@pytest.fixture
def client():
    async def echo(websocket):
        await websocket.accept()
        await websocket.send_text("hello")
        await websocket.close()

    inner = Starlette(routes=[Route("/", lambda request: PlainTextResponse("ok"), methods=["GET", "POST"]),
                              WebSocketRoute("/ws", echo)])
    return TestClient(RequestGuard(inner, AllowedHosts(frozenset({"testserver"}))))


def test_another_sites_websocket_handshake_is_refused(client):
    with client.websocket_connect("/ws", headers={"Origin": "http://testserver"}) as socket_:
        assert socket_.receive_text() == "hello"
    with pytest.raises(WebSocketDisconnect), client.websocket_connect("/ws", headers={"Origin": "https://evil.example"}):
        pass


def test_the_guard_refuses_with_a_reason(client):
    assert client.get("/").text == "ok"
    assert client.get("/", headers={"Host": "evil.example"}).status_code == 421
    refused = client.post("/", headers={"Referer": "https://evil.example/form.html"})
    assert refused.status_code == 403 and "Cross-site" in refused.text
    assert client.post("/", headers={"Referer": "http://testserver/"}).text == "ok"
    for url in ("https://example.com/x", "ftp://example.com/x", "HTTP://example.com/x"):
        assert client.get(f"/gradio_api/file={url}").status_code == 403, url
    # the app's own files are paths (a Windows one starts with its drive), not URLs: the guard lets them by
    assert client.get("/gradio_api/file=C:/Users/me/gradio/x.txt").status_code == 404
    assert client.get("/gradio_api/file=/tmp/gradio/x.txt").status_code == 404


def budgeted(tmp_path, clock):
    """A client for a guard (the app reachable by others) whose upload budget is 1000 bytes per visitor in 60 s
    and 3000 bytes in the upload folder ``tmp_path``."""
    from app.upload_budget import UploadBudget, UploadLimits

    async def upload(request):
        return PlainTextResponse(f"took {len(await request.body())}")

    inner = Starlette(routes=[Route("/gradio_api/upload", upload, methods=["POST"])])
    budget = UploadBudget(UploadLimits(per_client=1000, window=60, total=3000), folder=lambda: tmp_path,
                          clock=lambda: clock[0])
    hosts = AllowedHosts(frozenset({"testserver"}), others_reach=True)
    guard = RequestGuard(inner, hosts, budget)

    async def as_gradio(scope, receive, send):  # Gradio's app sits outside its middleware: its issued login tokens
        await guard({**scope, "app": SimpleNamespace(tokens={"tok2": "ada"})}, receive, send)

    return TestClient(as_gradio)


def test_uploads_past_a_visitors_budget_are_refused_until_the_window_passes(tmp_path):
    clock = [0.0]
    client = budgeted(tmp_path, clock)
    for _ in range(2):
        assert client.post("/gradio_api/upload", content=b"x" * 400).text == "took 400"
    refused = client.post("/gradio_api/upload", content=b"x" * 400)
    assert refused.status_code == 429 and "at most 1000 B per visitor" in refused.text  # was "at most 0 MiB"
    # another visitor (logged in: their cookie) has a budget of their own
    other = client.post("/gradio_api/upload", content=b"x" * 400, headers={"Cookie": "access-token-abc=tok2"})
    assert other.text == "took 400"
    clock[0] = 61.0
    assert client.post("/gradio_api/upload", content=b"x" * 400).text == "took 400"


def test_uploads_past_the_folders_budget_or_without_a_length_are_refused(tmp_path):
    clock = [0.0]
    client = budgeted(tmp_path, clock)
    (tmp_path / "held").mkdir()
    (tmp_path / "held" / "big.bin").write_bytes(b"x" * 2800)
    refused = client.post("/gradio_api/upload", content=b"x" * 400)
    assert refused.status_code == 413 and "upload folder is full (2.93 KiB)" in refused.text  # was "(0 MiB)"
    assert client.post("/gradio_api/upload", content=b"x" * 100).text == "took 100"
    chunked = client.post("/gradio_api/upload", content=iter([b"x" * 10]))  # no Content-Length
    assert chunked.status_code == 411


def test_only_an_app_others_reach_budgets_uploads():
    from app.upload_budget import UploadBudget

    assert RequestGuard(None, AllowedHosts.for_launch("127.0.0.1", share=False)).budget is None
    assert isinstance(RequestGuard(None, AllowedHosts.for_launch("127.0.0.1", share=True)).budget, UploadBudget)
    assert isinstance(RequestGuard(None, AllowedHosts.for_launch("0.0.0.0", share=False)).budget, UploadBudget)
