"""The first page's card in a real Chromium: shown above the page once its load event finds the local fake Hub
answering and the picker's pick reading more than the served model; its button downloads the pick and serves it
(the served model, stood in for as in the picker's unit tests, records the switch), and the card goes; a switch made
in the picker shows in the card at once."""

from __future__ import annotations

from pathlib import Path

import huggingface_hub.constants
import pytest
from chromium import chromium_page
from first_pick_hub import FILES, RTX_4090, on_the_4090, pick_id
from hub_server import HubServer
from picker_page import PICKER_TIMEOUT_MS, wait_text
from studio import served

from app.first_pick import FirstPick
from engine.models import load_catalogue, plan_entry

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

OTHER = "Qwen/Qwen3-4B"  # a catalogue model pinned to a commit, reading less here than the pick
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_the_card_shows_the_pick_and_its_button_downloads_and_serves_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADINFER_CACHE", str(tmp_path / "studio"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    pick = pick_id()
    picker = on_the_4090()
    with HubServer(pick, FILES) as hub, served(chunk_size=64, first_pick=FirstPick(picker).build) as url:
        picker.endpoint = hub.endpoint
        with chromium_page(url, timeout_ms=60_000) as page:
            card = page.locator("#first-pick")
            card.wait_for(state="visible")
            assert f"Reads whole books here: {pick}" in card.inner_text()
            assert card.bounding_box()["y"] < page.locator("#main").bounding_box()["y"]  # above the page, not in the picker
            page.locator("#first-pick-fetch").click()
            page.wait_for_function(f"() => document.querySelector('#first-pick-status')?.innerText"
                                   f".includes('Now serving {pick}')")
            card.wait_for(state="hidden")
    assert [name for _, name in picker.holder.switched] == [pick] and picker.holder.name == pick


def _cached_snapshot(hub_cache: Path, repo: str) -> None:
    """``repo`` in the Hugging Face cache at the commit the catalogue pins (the picker serves it without a download)."""
    from engine.models import load_catalogue

    revision = next(entry.revision for entry in load_catalogue() if entry.id == repo)
    folder = hub_cache / f"models--{repo.replace('/', '--')}" / "snapshots" / revision
    folder.mkdir(parents=True)
    for name, data in FILES.items():
        (folder / name).write_bytes(data)


def _serve_in_the_picker(page, label: str) -> None:
    page.fill("#picker-choice input", label)
    page.click(f"[role=option]:has-text('{label}')")
    page.click("#picker-serve")
    wait_text(page, "#picker-status", f"Now serving {label}")


def test_a_switch_in_the_picker_shows_in_the_card_at_once(tmp_path, monkeypatch):
    """The card names the served model and what it reads here: after the owner serves another model in the picker
    the card says so without a reload, and again after the switch back."""
    monkeypatch.setenv("HEADINFER_CACHE", str(tmp_path / "studio"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    _cached_snapshot(tmp_path / "hub", OTHER)
    picker = on_the_4090()
    other = plan_entry(next(e for e in load_catalogue() if e.id == OTHER), RTX_4090)
    with HubServer(pick_id(), FILES) as hub, served(chunk_size=64, picker=picker.build,
                                                    first_pick=FirstPick(picker).build) as url:
        picker.endpoint = hub.endpoint
        with chromium_page(url, timeout_ms=PICKER_TIMEOUT_MS) as page:
            wait_text(page, "#first-pick", "SmolLM2-135M-Instruct, served now, reads 8,192")
            page.click("#picker .label-wrap")
            wait_text(page, "#picker-table", OTHER)
            _serve_in_the_picker(page, OTHER)
            wait_text(page, "#first-pick", f"{OTHER}, served now, reads {other.reads_well:,}")
            assert "SmolLM2" not in page.inner_text("#first-pick")
            _serve_in_the_picker(page, SMOLLM2)
            wait_text(page, "#first-pick", "SmolLM2-135M-Instruct, served now, reads 8,192")
    assert [name for _, name in picker.holder.switched] == [OTHER, SMOLLM2]
