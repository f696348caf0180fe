"""The first page's card (``app.first_pick``): shown where the Hub answers and the picker's pick reads more here than
the served model, hidden offline or when the pick is served; its button downloads the pick from the local fake Hub
(``tests/engine/helpers/hub_server.py``) and serves it through the picker, for the owner alone."""

from __future__ import annotations

import re
import socket
import threading

import gradio as gr
import huggingface_hub.constants
import pytest
from first_pick_hub import FILES, RTX_4090, TINY_CONFIG, on_the_4090, pick_id
from hub_server import HubServer
from owner_link import gradio_request, owner_cookie

from app import escape
from app.first_pick import FirstPick, HubProbe, Pick, card_html
from app.owner import REFUSED, new_gate
from byte_units import format_bytes
from engine.models import load_catalogue, plan_entry


@pytest.fixture(autouse=True)
def caches(tmp_path, monkeypatch):
    """A fresh revision lock and Hugging Face cache: the pick is downloaded into them, never into the user's."""
    monkeypatch.setenv("HEADINFER_CACHE", str(tmp_path / "studio"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def _closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_the_card_names_the_pick_where_the_hub_answers_and_asks_the_hub_once():
    pick = pick_id()
    with HubServer(pick, FILES) as hub:
        card = FirstPick(on_the_4090(), endpoint=hub.endpoint)
        shown, facts = card.show()
        assert shown["visible"] is True
        assert f"Reads whole books here: {pick}</b>" in facts and "SmolLM2-135M-Instruct, served now" in facts
        fit = plan_entry(next(e for e in load_catalogue() if e.id == pick), RTX_4090)
        assert f"reads {fit.reads_well:,} tokens on this machine" in facts
        assert f"({format_bytes(fit.weights_bytes)})" in facts and "a stated rate, not measured" in facts
        assert card.show() == (shown, facts) and len(hub.requests) == 1  # the probe's answer is kept


def test_a_quantized_pick_says_which_quantization_and_that_it_is_lossy():
    entry = next(e for e in load_catalogue() if e.id == "Qwen/Qwen3.6-27B")
    fit = plan_entry(entry, RTX_4090)
    assert fit.weights_mode == "4bit"  # 55.6 GB in bf16 on a 24 GiB card
    facts = card_html(Pick(fit, "<img src=x onerror=alert(1)>", 8192))
    assert "Held as 4-bit weights" in facts and "a lossy copy of the bf16 weights" in facts
    # Sizes and the rate in the meters' units (issue 51: the card said "55.6 GB" and "50 MB/s" beside MiB/GiB).
    assert "Downloads 51.78 GiB: about 18 min at 50.00 MiB/s" in facts  # 55.6e9 bytes at the stated 50 MiB/s
    assert f"({format_bytes(fit.weights_bytes)})." in facts and not re.search(r"\d ?[KMGT]B\b", facts), facts
    assert "&lt;img src=x onerror=alert(1)&gt;, served now, reads 8,192" in facts and "<img" not in facts


def test_offline_the_card_stays_hidden(monkeypatch):
    card = FirstPick(on_the_4090(), endpoint=_closed_port())
    assert card.show() == ({"visible": False, "__type__": "update"}, "")
    with HubServer(pick_id(), FILES) as hub:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        assert FirstPick(on_the_4090(), endpoint=hub.endpoint).show()[1] == "" and not hub.requests


def test_a_probe_that_does_not_answer_in_time_does_not_hold_the_page():
    with socket.socket() as silent:  # accepts connections and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        probe = HubProbe(timeout=0.5)
        assert probe.reachable(f"http://127.0.0.1:{silent.getsockname()[1]}", "a/b", wait=0.1) is None
        assert probe.reachable(f"http://127.0.0.1:{silent.getsockname()[1]}", "a/b") is False


def test_no_card_when_the_served_model_is_already_the_pick():
    pick = pick_id()
    picker = on_the_4090()
    picker.holder.name = pick
    with HubServer(pick, FILES) as hub:
        assert FirstPick(picker, endpoint=hub.endpoint).show()[1] == ""


def test_the_owners_click_downloads_the_pick_then_serves_it():
    pick = pick_id()
    picker = on_the_4090()
    with HubServer(pick, FILES) as hub:
        picker.endpoint = hub.endpoint
        card = FirstPick(picker)
        assert card.show()[0]["visible"] is True
        said = list(card.download())
        assert f"Downloaded {pick}" in said[-1]
        message, shown, facts = card.serve()
    (folder, name), = picker.holder.switched
    assert name == pick == picker.holder.name and (folder and open(f"{folder}/config.json").read() == TINY_CONFIG)
    assert f"Now serving {pick}" in message
    assert shown["visible"] is False and facts == ""  # served now: nothing better to offer


def test_a_visitor_sees_the_facts_but_the_click_is_refused():
    pick = pick_id()
    gate = new_gate(private=True)
    picker = on_the_4090(gate)
    with HubServer(pick, FILES) as hub:
        card = FirstPick(picker, endpoint=hub.endpoint)
        picker.endpoint = hub.endpoint
        visitor = gradio_request()
        assert pick in card.show()[1]
        assert [escape.text(REFUSED) in said for said in card.download(visitor)] == [True]
        message, shown, _ = card.serve(visitor)
        assert not [r for r in hub.requests if "/resolve/" in r[1]] and picker.holder.switched == []
        said = list(card.download(gradio_request(owner_cookie(gate))))  # the owner's cookie opens it
    assert f"Downloaded {pick}" in said[-1] and shown["visible"] is True


def test_cancel_stops_the_cards_download_and_nothing_is_served():
    pick = pick_id()
    picker = on_the_4090()
    files = {**FILES, "model.safetensors": b"\0" * (24 << 20)}  # a cancel lands at the end of a 10 MiB read
    with HubServer(pick, files) as hub:
        hub.rate = 8 << 20
        picker.endpoint = hub.endpoint
        card = FirstPick(picker)
        said: list[str] = []
        worker = threading.Thread(target=lambda: [said.append(text) for text in card.download()])
        worker.start()
        while not any("Downloading" in s for s in said) and worker.is_alive():
            worker.join(0.05)
        card.cancel()
        worker.join(30)
        message, shown, _ = card.serve()
    assert "cancelled" in said[-1] and picker.holder.switched == [] and shown["visible"] is True


def test_the_card_follows_a_switch_made_in_the_picker():
    """A tab's card is made again once the served model is not the one it was made for, and only then."""
    pick = pick_id()
    picker = on_the_4090()
    with HubServer(pick, FILES) as hub:
        card = FirstPick(picker, endpoint=hub.endpoint)
        seen, _, facts = card.shown()
        assert seen == picker.holder.name and "SmolLM2-135M-Instruct, served now, reads 8,192" in facts
        assert card.follow(seen) == (gr.skip(),) * 3  # the same model: nothing to send
        picker.holder.name = "Qwen/Qwen3-4B"  # what a switch in the picker leaves
        other = plan_entry(next(e for e in load_catalogue() if e.id == "Qwen/Qwen3-4B"), RTX_4090)
        seen, shown, facts = card.follow(seen)
        assert seen == "Qwen/Qwen3-4B" and shown["visible"] is True
        assert f"Qwen/Qwen3-4B, served now, reads {other.reads_well:,}" in facts and "SmolLM2" not in facts
        picker.holder.name = pick
        assert card.follow(seen)[1:] == ({"visible": False, "__type__": "update"}, "")  # the pick served: no card
