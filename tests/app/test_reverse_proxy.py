"""``--allow-host NAME`` (repeatable): behind a reverse proxy under another domain, ``NAME`` is one of the app's names
and ``https://NAME`` one of its origins, whether the proxy passes ``Host: NAME`` on or rewrites it to the loopback
address it forwards to; every other name and origin is still refused, and the app counts as reached by others."""

from __future__ import annotations

import socket

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from app import cli
from app.guard import RequestGuard
from app.hosts import AllowedHosts, HostNameError, proxy_name

PROXY = "studio.example.org"


def _hosts(*flags: str) -> AllowedHosts:
    """The names and origins ``launch.py FLAGS`` answers to (as its main computes them)."""
    args = cli.build_parser().parse_args(list(flags))
    return AllowedHosts.for_launch(args.host, share=args.share, proxied=tuple(args.allow_host))


def test_each_allowed_host_is_a_name_and_its_https_origin_is_the_apps():
    hosts = _hosts("--allow-host", PROXY, "--allow-host", "Other.Example.ORG:8443")
    assert hosts.others_reach and RequestGuard(None, hosts).budget is not None  # its visitors are others: budgeted
    assert hosts.allows(PROXY) and hosts.allows(f"{PROXY}:443") and hosts.allows("other.example.org:8443")
    assert hosts.allows("127.0.0.1:7860") and not hosts.allows("evil.example")
    assert not hosts.allows(f"x.{PROXY}") and not hosts.allows(f"{PROXY}.evil.example")
    # The proxy rewrote Host to where it forwards: the browser's Origin still names the proxy.
    assert hosts.own_origin(f"https://{PROXY}", "127.0.0.1:7860")
    assert hosts.own_origin(f"https://{PROXY}/page?x=1", "127.0.0.1:7860")  # a Referer
    assert hosts.own_origin("https://other.example.org:8443", "127.0.0.1:7860")
    for foreign in (f"http://{PROXY}", f"https://{PROXY}:8443", "https://other.example.org", "https://evil.example",
                    f"https://x.{PROXY}", "null"):
        assert not hosts.own_origin(foreign, "127.0.0.1:7860"), foreign
    # Without the flag, the proxy's name is another site's.
    plain = _hosts()
    assert not plain.others_reach and not plain.allows(PROXY)
    assert not plain.own_origin(f"https://{PROXY}", "127.0.0.1:7860")


@pytest.mark.parametrize("bad", ["https://studio.example.org", "studio.example.org/app", "*.example.org",
                                 "user@studio.example.org", "", "a b"])
def test_an_allowed_host_is_a_host_name_and_nothing_else(bad, capsys):
    with pytest.raises(HostNameError):
        proxy_name(bad)
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--allow-host", bad])
    assert "--allow-host" in capsys.readouterr().err


def test_the_guard_serves_the_proxys_requests_and_refuses_other_sites():
    inner = Starlette(routes=[Route("/gradio_api/queue/join", lambda request: PlainTextResponse("ok"),
                                    methods=["POST"])])
    client = TestClient(RequestGuard(inner, _hosts("--allow-host", PROXY)), base_url="http://127.0.0.1:7860")
    origin = {"Origin": f"https://{PROXY}"}
    assert client.post("/gradio_api/queue/join", headers=origin).text == "ok"  # Host rewritten to loopback
    assert client.post("/gradio_api/queue/join", headers={**origin, "Host": PROXY}).text == "ok"  # Host passed on
    assert client.post("/gradio_api/queue/join", headers={"Referer": f"https://{PROXY}/"}).text == "ok"
    for headers in ({"Origin": "https://evil.example"}, {"Origin": f"http://{PROXY}"},
                    {"Referer": "https://evil.example/form.html"}):
        assert client.post("/gradio_api/queue/join", headers=headers).status_code == 403, headers
    assert client.post("/gradio_api/queue/join", headers={**origin, "Host": "evil.example"}).status_code == 421
    # The same app without the flag refuses the proxy's page as another site.
    plain = TestClient(RequestGuard(inner, _hosts()), base_url="http://127.0.0.1:7860")
    assert plain.post("/gradio_api/queue/join", headers=origin).status_code == 403
    assert plain.post("/gradio_api/queue/join", headers={**origin, "Host": PROXY}).status_code == 421


def test_every_address_with_a_proxy_keeps_this_machines_names():
    hosts = _hosts("--host", "0.0.0.0", "--allow-host", PROXY)
    assert hosts.allows(socket.gethostname()) and hosts.allows(PROXY)
