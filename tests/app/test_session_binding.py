"""A tab's session hash is its browser's alone (``app.session_binding``): on a real port, another browser's id cookie
(or none) naming a tab's hash is refused on the event stream, the queue join and Gradio's other hash-keyed routes,
while the tab's own browser, and a cookieless client on a hash of its own (``gradio_client``), go on as before."""

from __future__ import annotations

import json

import httpx
import pytest

from app.browser_id import COOKIE
from app.session_binding import NOT_YOURS, SessionBindings


def _browser(base_url: str, cookie: str | None = None) -> httpx.Client:
    """A client as a browser tab is one: it loaded the page (and got its id cookie), or holds ``cookie``."""
    client = httpx.Client(base_url=base_url, timeout=60, headers={"Origin": base_url})
    if cookie is None:
        client.get("/")
        assert client.cookies.get(COOKIE)
    else:
        client.cookies.set(COOKIE, cookie)
    return client


def _join(client: httpx.Client, session_hash: str, api_name: str, data: list) -> httpx.Response:
    config = client.get("/config").json()
    fn_index = next(dep["id"] for dep in config["dependencies"] if dep.get("api_name") == api_name)
    body = {"data": data, "fn_index": fn_index, "session_hash": session_hash, "event_data": None, "trigger_id": None}
    return client.post("/gradio_api/queue/join", json=body)


def _events(client: httpx.Client, session_hash: str) -> list[dict]:
    """The tab's event stream, read to its event's end."""
    events = []
    with client.stream("GET", "/gradio_api/queue/data", params={"session_hash": session_hash}) as stream:
        assert stream.status_code == 200
        for line in stream.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
                if events[-1].get("msg") == "process_completed":
                    break
    return events


def _status(client: httpx.Client, method: str, path: str, **kwargs) -> tuple[int, str]:
    """The answer's status and first line, read without waiting for a stream's end (an event stream never ends)."""
    with client.stream(method, path, **kwargs) as response:
        line = next(response.iter_lines(), "") if response.status_code != 200 else ""
        return response.status_code, line


def _refused_everywhere(client: httpx.Client, session_hash: str, api_name: str, data: list) -> None:
    routes = [("GET", "/gradio_api/queue/data", {"params": {"session_hash": session_hash}}),
              ("GET", f"/gradio_api/heartbeat/{session_hash}", {}),
              ("GET", "/gradio_api/deep_link", {"params": {"session_hash": session_hash}}),
              ("POST", "/gradio_api/cancel", {"json": {"session_hash": session_hash, "fn_index": 0, "event_id": "x"}})]
    for method, path, kwargs in routes:
        assert _status(client, method, path, **kwargs) == (403, NOT_YOURS), path
    joined = _join(client, session_hash, api_name, data)
    assert joined.status_code == 403 and joined.text.strip() == NOT_YOURS and "event_id" not in joined.text


def test_another_browser_is_refused_a_backend_tabs_hash_and_its_own_browser_is_not(backend_served):
    url, demo, _ = backend_served
    alice, bob = _browser(url), _browser(url)
    joined = _join(alice, "bindtest001", "choose", [[], "team/model", None])
    assert joined.status_code == 200 and joined.json()["event_id"]
    assert _events(alice, "bindtest001")[-1].get("success") is True
    _refused_everywhere(bob, "bindtest001", "choose", [[], "team/model", None])
    _refused_everywhere(httpx.Client(base_url=url, timeout=60), "bindtest001", "choose", [[], "team/model", None])
    # Alice's cookie from another connection (her next event, her reopened stream) is hers.
    again = _browser(url, alice.cookies.get(COOKIE))
    assert _join(again, "bindtest001", "choose", [[], "team/model", None]).status_code == 200
    assert _events(again, "bindtest001")[-1].get("success") is True
    assert "bindtest001" in demo.backend_page.tabs


def test_a_cookieless_client_keeps_a_hash_of_its_own_and_a_browser_cannot_take_it(backend_served):
    url, _, _ = backend_served
    script = httpx.Client(base_url=url, timeout=60)  # as gradio_client is: no page loaded, so no id cookie
    for _ in range(2):
        assert _join(script, "scripttest1", "choose", [[], "team/model", None]).status_code == 200
        assert _events(script, "scripttest1")[-1].get("success") is True
    _refused_everywhere(_browser(url), "scripttest1", "choose", [[], "team/model", None])


@pytest.mark.slow
def test_another_browser_is_refused_a_studio_tabs_hash(share_url):
    alice, bob = _browser(share_url), _browser(share_url)
    assert _join(alice, "bindstudio1", "page", ["1", None]).status_code == 200
    assert _events(alice, "bindstudio1")[-1].get("msg") == "process_completed"
    _refused_everywhere(bob, "bindstudio1", "page", ["1", None])


def test_a_hash_is_held_while_open_and_forgotten_after_its_idle_time():
    now = [0.0]
    bindings = SessionBindings(capacity=10, idle_seconds=100.0, clock=lambda: now[0])
    assert bindings.claim({"tab"}, "alice") is None  # the heartbeat: open while the tab is
    now[0] = 1000.0
    assert bindings.claim({"tab"}, "bob") == (403, NOT_YOURS)
    bindings.release({"tab"})  # the tab closed
    now[0] = 1099.0
    assert bindings.claim({"tab"}, None) == (403, NOT_YOURS)
    now[0] = 1101.0
    assert bindings.claim({"tab"}, "bob") is None  # forgotten: bound anew
    bindings.release({"tab"})
    now[0] = 5000.0
    assert bindings.claim({"other"}, "carol") is None and len(bindings) == 1  # the idle one swept


def test_memory_is_bounded_the_longest_idle_forgotten_first_and_open_tabs_kept():
    bindings = SessionBindings(capacity=3, idle_seconds=1e9, clock=lambda: 0.0)
    for name in ("a", "b", "c"):
        assert bindings.claim({name}, name) is None
    bindings.release({"b"})
    assert bindings.claim({"d"}, "d") is None and len(bindings) == 3  # b, the idle one, forgotten
    # All open: a new tab is bound past the capacity (open requests are the server's to bound), none forgotten.
    assert bindings.claim({"b"}, "mallory") is None and len(bindings) == 4
    for name in ("a", "b", "d"):
        bindings.release({name})
    assert bindings.claim({"e"}, "e") is None and len(bindings) == 3  # back to the capacity: a, b, d idle, two forgotten
    assert bindings.claim({"c"}, "mallory") == (403, NOT_YOURS)
