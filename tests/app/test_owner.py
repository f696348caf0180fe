"""The model picker is the owner's when others can reach the app: the owner link's middleware (``app.owner``) gives the
owner's browser a cookie, and the picker's handlers, given the ``gr.Request`` Gradio builds from the HTTP request,
refuse a visitor without it. An uploaded file is never a model source, for the owner either."""

from __future__ import annotations

import hashlib
import hmac
from types import SimpleNamespace

from first_pick_hub import TINY_CONFIG, on_the_4090
from owner_link import gradio_request, owner_app, owner_cookie
from starlette.testclient import TestClient

from app.owner import COOKIE, OPEN, new_gate, owner_middleware
from engine.models import DownloadJob
from engine.models.catalogue import load_catalogue


def _model_folder(path):
    path.mkdir(parents=True)
    (path / "config.json").write_text(TINY_CONFIG)
    return path


# -- the owner link ---------------------------------------------------------------------------------------------------
def test_the_right_key_sets_an_httponly_strict_cookie_and_redirects_the_key_out_of_the_url():
    gate = new_gate(private=True)
    with TestClient(owner_app(gate), follow_redirects=False) as client:
        response = client.get(f"/?owner={gate.key}")
    assert response.status_code == 303 and response.headers["location"] == "/"
    cookie = response.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert gate.key not in cookie  # the cookie holds a token derived from the key, never the key
    assert response.cookies[COOKIE] == gate.token != gate.key
    assert gate.key not in repr(gate)  # nor does a log line of the gate carry it


def test_a_wrong_key_gets_the_page_as_any_visitor_and_no_cookie():
    gate = new_gate(private=True)
    with TestClient(owner_app(gate), follow_redirects=False) as client:
        for url in (f"/?owner={gate.key[:-1]}x", "/?owner=", f"/?owner={new_gate(private=True).key}", "/"):
            response = client.get(url)
            assert response.status_code == 200 and response.text == "the page", url
            assert "set-cookie" not in response.headers, url


def test_open_gate_installs_no_middleware_and_makes_everyone_the_owner():
    assert owner_middleware(OPEN) == [] and owner_middleware(None) == [] and len(owner_middleware(new_gate(True))) == 1
    assert new_gate(private=False) is OPEN and not OPEN.private
    assert OPEN.is_owner(None) and OPEN.is_owner(gradio_request())
    assert new_gate(True).key != new_gate(True).key  # a new key at each start


def test_only_the_owners_cookie_opens_the_gate():
    gate, other = new_gate(True), new_gate(True)
    assert gate.is_owner(gradio_request(owner_cookie(gate)))
    one_off = gate.token[:-1] + ("1" if gate.token.endswith("0") else "0")
    forged = [None, f"{COOKIE}=", f"{COOKIE}={gate.key}", f"{COOKIE}={other.token}", f"{COOKIE}={one_off}",
              f"{COOKIE}={hmac.new(b'guess', b'headinfer-studio owner cookie v1', hashlib.sha256).hexdigest()}",
              f"other={gate.token}"]
    for cookie in forged:
        assert not gate.is_owner(gradio_request(cookie)), cookie
    assert not gate.is_owner(None)  # a direct call, with no request, is no owner's


# -- the picker's handlers --------------------------------------------------------------------------------------------
def test_a_visitor_can_neither_scan_a_folder_nor_download_nor_serve(tmp_path):
    gate = new_gate(True)
    folder = _model_folder(tmp_path / "server" / "tiny")
    picker = on_the_4090(gate)
    visitor = gradio_request()
    rows, line, choices = picker.refresh(str(folder), None, visitor)
    assert "Not scanned" in line and "owner link printed in the console" in line
    assert picker.user_folders == [] and "tiny" not in {row[0] for row in rows}
    assert {row[0] for row in rows} == {e.id for e in load_catalogue()}  # the catalogue alone
    assert not any(str(tmp_path) in str(cell) for row in rows for cell in row)  # no server path
    assert "owner link" in picker.serve("HuggingFaceTB/SmolLM2-135M-Instruct", visitor)
    assert picker.holder.switched == []
    assert ["owner link" in text for text in picker.download("Qwen/Qwen3-4B", visitor)] == [True]
    assert picker._job is None
    picker._job = job = DownloadJob("Qwen/Qwen3-4B")  # the owner's download, running
    picker.cancel(visitor)
    assert not job._cancel.is_set()
    picker.cancel(gradio_request(owner_cookie(gate)))
    assert job._cancel.is_set()
    forged = gradio_request(f"{COOKIE}={gate.key}")
    assert "owner link" in picker.serve("HuggingFaceTB/SmolLM2-135M-Instruct", forged) and not picker.holder.switched


def test_a_visitors_table_does_not_unlist_what_the_owner_found(tmp_path):
    """The entries the owner may serve are the owner's table's: a visitor's catalogue-only refresh leaves them."""
    gate = new_gate(True)
    folder = _model_folder(tmp_path / "tiny")
    picker = on_the_4090(gate)
    owner = gradio_request(owner_cookie(gate))
    picker.refresh(str(folder), None, owner)
    picker.refresh(None, None, gradio_request())
    assert "Now serving tiny" in picker.serve(str(folder), owner)


def test_the_owner_scans_a_folder_and_serves_from_it(tmp_path):
    gate = new_gate(True)
    folder = _model_folder(tmp_path / "tiny")
    picker = on_the_4090(gate)
    owner = gradio_request(owner_cookie(gate))
    rows, line, _ = picker.refresh(str(folder), None, owner)
    assert "Not scanned" not in line
    assert {row[0]: row[14] for row in rows}["tiny"] == f"folder: {folder}"
    assert "Now serving tiny" in picker.serve(str(folder), owner)
    assert picker.holder.switched == [(str(folder), "tiny")]


def test_an_uploaded_file_is_never_a_model_source(tmp_path):
    """Not listed when the owner scans the upload folder or a folder linking into it, and not served even when it
    was listed before it came to lie there."""
    uploads = tmp_path / "uploads"
    uploaded = _model_folder(uploads / "pid-1" / "0a1b2c" / "evil")
    elsewhere = tmp_path / "models"
    elsewhere.mkdir()
    (elsewhere / "evil-link").symlink_to(uploaded, target_is_directory=True)
    for gate in (OPEN, new_gate(True)):  # the local owner too
        picker = on_the_4090(gate, uploads=[uploads])
        owner = gradio_request(owner_cookie(gate)) if gate.private else None
        for folder in (uploaded, uploads, elsewhere):
            rows, _, _ = picker.refresh(str(folder), None, owner)
            assert "evil" not in {row[0] for row in rows} and "evil-link" not in {row[0] for row in rows}, folder
        picker._entries[str(uploaded)] = SimpleNamespace(location=str(uploaded), id="evil")  # listed earlier
        assert "never served" in picker.serve(str(uploaded), owner) and picker.holder.switched == []


def test_gradio_passes_the_request_to_the_picker_handlers():
    """Every picker event gets Gradio's ``gr.Request`` (how the gate sees the cookie): Gradio fills a parameter whose
    type hint is ``gr.Request`` and leaves it out of the event's inputs."""
    from typing import get_type_hints

    from gradio.utils import get_function_params, is_special_typed_parameter

    picker = on_the_4090(new_gate(True))
    for handler in (picker.refresh, picker.refresh_for, picker.refresh_alone, picker.download, picker.cancel,
                    picker.serve):
        assert is_special_typed_parameter("request", get_type_hints(handler)), handler.__name__
        assert "request" not in [name for name, *_ in get_function_params(handler)], handler.__name__
