"""The ``--backend`` page served on a port as ``launch.py --backend --share`` serves it (``launch_options``: the
page's guard, its policy and the browser's id cookie), over the in-process ``SimulatedBackend`` (``backend_served``
in tests/app/conftest.py): a visitor can make the server neither fetch a URL nor read one of its own files through
the page's file input."""

from __future__ import annotations

import json

import httpx

from app.browser_id import COOKIE


def _choose(base: str, files: list[dict], session_hash: str) -> tuple[httpx.Response, list[dict]]:
    """The page's file input changed to ``files`` (``FileData`` objects), as the page's own queue join sends it;
    the join's answer and, when taken, the events Gradio streams for it."""
    with httpx.Client(base_url=base, timeout=60) as http:
        http.get("/")  # the page: its browser id cookie
        assert http.cookies.get(COOKIE)
        config = http.get("/config").json()
        fn_index = next(dep["id"] for dep in config["dependencies"] if dep.get("api_name") == "choose")
        body = {"data": [files, "team/model", None], "fn_index": fn_index, "session_hash": session_hash,
                "event_data": None, "trigger_id": None}
        joined = http.post("/gradio_api/queue/join", json=body, headers={"Origin": base})
        events = []
        if joined.status_code == 200:
            with http.stream("GET", "/gradio_api/queue/data", params={"session_hash": session_hash}) as stream:
                for line in stream.iter_lines():
                    if line.startswith("data:"):
                        events.append(json.loads(line[5:]))
                        if events[-1].get("msg") == "process_completed":
                            break
        return joined, events


def _file(path: str) -> dict:
    return {"path": path, "meta": {"_type": "gradio.FileData"}}


def test_a_file_named_by_url_is_refused_before_anything_is_fetched(backend_served):
    base, _, backend = backend_served
    joined, _ = _choose(base, [_file("https://93.184.215.14/ten-gigabytes.pdf")], "urltest0001")
    assert joined.status_code == 403 and "not by URL" in joined.text
    fetched = httpx.get(f"{base}/gradio_api/file=http://93.184.215.14/x.pdf", timeout=30)
    assert fetched.status_code == 403 and backend.chats == []


def test_a_server_file_named_as_an_upload_is_not_read(backend_served, tmp_path):
    base, demo, backend = backend_served
    secret = tmp_path / "secret.txt"
    secret.write_text("The owner's password is HUNTER2.")
    joined, events = _choose(base, [_file(str(secret))], "pathtest001")
    done = events[-1] if events else {}
    said = json.dumps(done)
    assert done.get("msg") == "process_completed" and done.get("success") is False, said
    assert "HUNTER2" not in said and "notes" not in said
    assert all(not tab.documents for tab in demo.backend_page.tabs.values())  # no tab holds it


def test_an_uploaded_file_is_read(backend_served, tmp_path):
    # The same join with a file the page uploaded: taken, so the refusals above are the path's, not the join's.
    base, demo, _ = backend_served
    note = tmp_path / "notes.txt"
    note.write_text("=== notes ===\nThe code is ORCHID-7.")
    with note.open("rb") as handle:
        uploaded = httpx.post(f"{base}/gradio_api/upload", files={"files": ("notes.txt", handle, "text/plain")},
                              headers={"Origin": base}, timeout=30).json()[0]
    joined, events = _choose(base, [_file(uploaded)], "uploadtest1")
    assert joined.status_code == 200 and events[-1].get("success") is True, events[-1]
    assert [d.name for d in demo.backend_page.tabs["uploadtest1"].documents] == ["notes.txt"]
    # Another browser (its own id cookie) joining with that tab's session hash: refused at the door
    # (app.session_binding), the tab's files kept.
    joined, events = _choose(base, [], "uploadtest1")
    assert joined.status_code == 403 and "another browser" in joined.text and events == []
    assert [d.name for d in demo.backend_page.tabs["uploadtest1"].documents] == ["notes.txt"]
