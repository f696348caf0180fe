"""The first page's card in a real Chromium: shown above the page once its load event finds the local fake Hub
answering and the picker's pick reading more than the served model; its button downloads the pick and serves it
(the served model, stood in for as in the picker's unit tests, records the switch), and the card goes."""

from __future__ import annotations

import huggingface_hub.constants
import pytest
from chromium import chromium_page
from first_pick_hub import FILES, on_the_4090, pick_id
from hub_server import HubServer
from studio import served

from app.first_pick import FirstPick

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


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
