"""The studio served on a port answers its own names and its own page only (``app.guard``, ``app.hosts``,
``app.csp``): a rebinding name, another site's upload or queue join, a URL for Gradio to fetch are refused;
Gradio's CORS never echoes another origin; every response carries the page's policy."""

from __future__ import annotations

import re
import socket

import gradio
import httpx
import pytest

from app.csp import policy, script_hash
from app.ui import launch_options

pytestmark = pytest.mark.slow

SHARE_HOST = "k3x9q2.gradio.live"  # a share link's name: the tunnel forwards it as the Host header
EVIL = "https://evil.example"


def upload(share_url: str, tmp_path, **headers) -> httpx.Response:
    note = tmp_path / "note.txt"
    note.write_text("The code is AMBER-7.", encoding="utf-8")
    with note.open("rb") as handle:
        return httpx.post(f"{share_url}/gradio_api/upload", files={"files": ("note.txt", handle, "text/plain")},
                          headers=headers, timeout=30)


def join(share_url: str, **headers) -> httpx.Response:
    config = httpx.get(f"{share_url}/config", timeout=30).json()
    fn_index = next(dep["id"] for dep in config["dependencies"] if dep.get("api_name") == "page")
    body = {"data": ["1", None], "fn_index": fn_index, "session_hash": "guardtest01", "event_data": None}
    return httpx.post(f"{share_url}/gradio_api/queue/join", json=body, headers=headers, timeout=30)


def test_a_rebinding_name_is_refused_and_the_apps_own_names_are_served(share_url):
    port = share_url.rsplit(":", 1)[1]
    for host in ("evil.example", f"evil.example:{port}", "gradio.live", "a.k3x9q2.gradio.live",
                 "k3x9q2.gradio.live.evil.example", "localhost.evil.example", "10.1.2.3"):
        response = httpx.get(f"{share_url}/", headers={"Host": host}, timeout=30)
        assert response.status_code == 421, host
        assert "host name" in response.text and "gradio_config" not in response.text
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "127.0.0.1", SHARE_HOST, f"{SHARE_HOST}:443"):
        response = httpx.get(f"{share_url}/", headers={"Host": host}, timeout=30)
        assert response.status_code == 200 and "gradio_config" in response.text, host


def test_another_sites_upload_is_refused_and_the_pages_own_is_taken(share_url, tmp_path):
    for headers in ({"Origin": EVIL}, {"Origin": "null"}, {"Referer": f"{EVIL}/attack.html"},
                    {"Origin": share_url.replace("127.0.0.1", "localhost")}):  # another origin, though loopback too
        refused = upload(share_url, tmp_path, **headers)
        assert refused.status_code == 403, headers
        assert "Cross-site" in refused.text
    taken = upload(share_url, tmp_path, Origin=share_url, Referer=f"{share_url}/")
    assert taken.status_code == 200 and taken.json()[0].endswith("note.txt")
    assert upload(share_url, tmp_path).status_code == 200  # a client that is no browser sends neither header


def test_another_sites_queue_join_is_refused_and_the_pages_own_is_taken(share_url):
    refused = join(share_url, Origin=EVIL)
    assert refused.status_code == 403 and "event_id" not in refused.text
    taken = join(share_url, Origin=share_url)
    assert taken.status_code == 200 and taken.json()["event_id"]


def test_cors_never_echoes_another_origin(share_url):
    # Through the share name Gradio's own CORS layer would echo any origin, with credentials.
    share = {"Host": SHARE_HOST}
    preflight = httpx.options(f"{share_url}/gradio_api/upload", timeout=30, headers={
        **share, "Origin": EVIL, "Access-Control-Request-Method": "POST"})
    read = httpx.get(f"{share_url}/config", headers={**share, "Origin": EVIL}, timeout=30)
    stream = httpx.get(f"{share_url}/gradio_api/queue/data?session_hash=guardtest01", timeout=30,
                       headers={**share, "Origin": EVIL})
    for response in (preflight, read, stream):
        assert response.status_code == 403
        assert "access-control-allow-origin" not in response.headers
        assert "access-control-allow-credentials" not in response.headers
    mine = httpx.get(f"{share_url}/config", headers={**share, "Origin": f"https://{SHARE_HOST}"}, timeout=30)
    assert mine.status_code == 200
    assert mine.headers.get("access-control-allow-origin") in (None, f"https://{SHARE_HOST}")


def test_the_server_fetches_no_url_for_a_file_route(share_url, tmp_path):
    # 93.184.215.14 is a public address: Gradio would fetch it (and answer from it) for file=.
    for path in ("/gradio_api/file=http://93.184.215.14/x.png", "/gradio_api/file=https://93.184.215.14/x",
                 "/gradio_api/file=HTTP://93.184.215.14/x", "/gradio_api/file=http%3A//93.184.215.14/x",
                 "/gradio_api/proxy=https://93.184.215.14/x"):
        response = httpx.get(f"{share_url}{path}", timeout=5)
        assert response.status_code == 403, path
        assert "not URLs" in response.text
    uploaded = upload(share_url, tmp_path, Origin=share_url).json()[0]
    served = httpx.get(f"{share_url}/gradio_api/file={uploaded}", timeout=30)
    assert served.status_code == 200 and "AMBER-7" in served.text  # the app's own files still are served


def test_a_queue_join_naming_a_file_by_url_is_refused_and_an_uploaded_one_is_taken(share_url, tmp_path):
    # Gradio would download the URL into the upload folder, whole, outside the upload budget (app.request_body).
    config = httpx.get(f"{share_url}/config", timeout=30).json()
    fn_index = next(dep["id"] for dep in config["dependencies"] if dep.get("api_name") == "upload")
    remote = {"path": "https://93.184.215.14/ten-gigabytes.pdf", "meta": {"_type": "gradio.FileData"}}
    body = {"data": [[remote], None], "fn_index": fn_index, "session_hash": "guardtest02", "event_data": None}
    refused = httpx.post(f"{share_url}/gradio_api/queue/join", json=body, headers={"Origin": share_url}, timeout=30)
    assert refused.status_code == 403 and "not by URL" in refused.text and "event_id" not in refused.text
    uploaded = upload(share_url, tmp_path, Origin=share_url).json()[0]
    body["data"][0] = [{"path": uploaded, "meta": {"_type": "gradio.FileData"}}]
    taken = httpx.post(f"{share_url}/gradio_api/queue/join", json=body, headers={"Origin": share_url}, timeout=30)
    assert taken.status_code == 200 and taken.json()["event_id"]


def test_every_response_carries_the_policy_and_the_page_allows_only_its_own_scripts(share_url):
    page = httpx.get(f"{share_url}/", timeout=30)
    policy = page.headers["content-security-policy"]
    directives = {part.split()[0]: part.split()[1:] for part in policy.split("; ")}
    assert directives["default-src"] == ["'self'"] and directives["connect-src"] == ["'self'"]
    assert directives["frame-ancestors"] == ["'none'"] and directives["form-action"] == ["'self'"]
    assert directives["base-uri"] == ["'self'"] and directives["object-src"] == ["'none'"]
    assert "'unsafe-inline'" not in directives["script-src"]
    assert directives["img-src"] == ["'self'", "data:", "blob:"]
    inline = re.findall(r"<script\b(?![^>]*\bsrc=)[^>]*>(.*?)</script>", page.text, re.DOTALL)
    assert len(inline) >= 4  # Gradio's config and loaders
    for text in inline:
        assert script_hash(text) in directives["script-src"]
    head = re.search(r"<script>(.*)</script>", launch_options(1 << 20)["head"], re.DOTALL).group(1)
    assert script_hash(head) in directives["script-src"]  # the upload check, which Gradio adds to the page later
    # Any other response allows the upload check alone: a file served from the app runs none of its scripts.
    other = httpx.get(f"{share_url}/config", timeout=30).headers["content-security-policy"]
    assert re.findall(r"'sha256-[^']+'", other) == [script_hash(head)]


def test_the_share_page_may_load_gradios_front_end_and_nothing_else_from_away(share_url):
    # Gradio's share.html loads its front end from Gradio's CDN, this version's folder.
    header = httpx.get(f"{share_url}/", timeout=30).headers["content-security-policy"]
    directives = {part.split()[0]: part.split()[1:] for part in header.split("; ")}
    away = {name: [source for source in sources if "://" in source] for name, sources in directives.items()}
    cdn = "https://gradio.s3-us-west-2.amazonaws.com"
    assert away.pop("script-src") == [f"{cdn}/{gradio.__version__}/"]  # scripts from this version's folder only
    assert away.pop("style-src") == [cdn] and away.pop("font-src") == [cdn]
    assert not any(away.values()), away
    assert "://" not in policy(share=False)


def test_an_uploaded_script_is_served_with_nosniff_and_no_referrer_leaves(share_url, tmp_path):
    # Chromium would run an octet-stream answer from <script src> (which 'self' allows) but for nosniff.
    script = tmp_path / "evil.js"
    script.write_text("alert(1)", encoding="utf-8")
    with script.open("rb") as handle:
        uploaded = httpx.post(f"{share_url}/gradio_api/upload", files={"files": ("evil.js", handle, "text/javascript")},
                              timeout=30).json()[0]
    for response in (httpx.get(f"{share_url}/gradio_api/file={uploaded}", timeout=30),
                     httpx.get(f"{share_url}/", timeout=30)):
        assert response.status_code == 200
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "same-origin"


def test_a_forged_x_forwarded_for_from_loopback_is_not_believed(monkeypatch):
    import argparse

    from starlette.middleware import Middleware

    from app.startup import serve

    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)  # as a fresh start has it; undone after
    seen: list[str] = []

    class Recorder:  # what the app's middleware (app.auth.LoginAddress among them) sees as the client
        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            if scope["type"] == "http" and scope.get("path") == "/config":
                seen.append(scope["client"][0])
            await self.app(scope, receive, send)

    with gradio.Blocks() as demo:
        gradio.Markdown("hello")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    try:
        serve(demo, argparse.Namespace(host="127.0.0.1", port=port, max_upload=None, share=False), False,
              app_kwargs={"middleware": [Middleware(Recorder)]})
        for forged in ({"X-Forwarded-For": "203.0.113.9"}, {"X-Forwarded-For": "203.0.113.9, 198.51.100.4"}):
            assert httpx.get(f"{demo.local_url.rstrip('/')}/config", headers=forged, timeout=30).status_code == 200
    finally:
        demo.close()
    assert seen == ["127.0.0.1", "127.0.0.1"]
