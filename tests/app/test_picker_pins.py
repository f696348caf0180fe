"""The picker says which Hub commit each catalogue model downloads (pinned by the catalogue, by this machine's first
download, or not yet), escaped; "Update to the latest" moves a first-download pin to main's newest commit, for the
owner alone. Against the local fake Hub (``tests/engine/helpers/hub_server.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from first_pick_hub import on_the_4090
from hub_server import COMMIT, HubServer
from owner_link import gradio_request, owner_cookie

from app import escape
from app.owner import OPEN, REFUSED, new_gate
from engine.models import hub_lock

UNPINNED = "Qwen/Qwen3.6-27B"  # 'main' in catalogue.json
PINNED = ("Qwen/Qwen3-8B", "b968826")  # a commit in catalogue.json
FILES = {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"\0" * 4096}


@pytest.fixture
def studio_cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "<img src=x onerror=alert(1)>"  # a hostile folder name reaches the page in the lock's message
    monkeypatch.setenv("HEADINFER_CACHE", str(folder))
    return folder


def test_the_picker_says_how_each_hub_model_is_pinned(studio_cache):
    picker = on_the_4090(OPEN)
    _, line, _ = picker.refresh()
    assert f"{PINNED[0]}: pinned to {PINNED[1]}</li>" in line
    assert f"{UNPINNED}: unpinned: the first download pins the commit it fetches</li>" in line
    assert "SmolLM2-135M-Instruct" not in line.split("picker-pins")[1]  # the embedded model downloads nothing
    hub_lock.record(hub_lock.new_pin(UNPINNED, COMMIT, "main", "download"))
    _, line, _ = picker.refresh()
    assert f"{UNPINNED}: pinned at first download: {COMMIT[:7]}</li>" in line


def test_a_damaged_lock_file_is_shown_escaped_and_the_table_stays(studio_cache):
    hub_lock.lock_path().parent.mkdir(parents=True)
    hub_lock.lock_path().write_text("{damaged")
    rows, line, _ = on_the_4090(OPEN).refresh()
    assert rows and f"{UNPINNED}: lock file damaged, downloads refused" in line
    assert "&lt;img src=x onerror=alert(1)&gt;" in line and "<img" not in line
    assert f"{PINNED[0]}: pinned to {PINNED[1]}" in line


def test_only_the_owner_updates_a_pin_to_mains_latest_commit(studio_cache):
    gate = new_gate(private=True)
    owner = gradio_request(owner_cookie(gate))
    picker = on_the_4090(gate)
    picker.refresh(None, None, owner)
    with HubServer(UNPINNED, FILES) as hub:
        picker.endpoint = hub.endpoint
        refused = picker.update(UNPINNED, gradio_request())
        assert escape.text(REFUSED) in refused and not hub.requests and hub_lock.locked(UNPINNED) is None
        first = picker.update(UNPINNED, owner)
        assert f"now pinned to {COMMIT[:7]} (unpinned before)" in first
        later = hub.push({**FILES, "config.json": b'{"model_type": "llama", "v": 2}'})
        second = picker.update(UNPINNED, owner)
    assert f"now pinned to {later[:7]} (was {COMMIT[:7]})" in second
    assert hub_lock.locked(UNPINNED).sha == later
    assert "pinned by the catalogue" in picker.update(PINNED[0], owner)
