"""What the page says of the documents holds together (issue 51): one token count per thing (the files table's total,
the plan, the status and the read's progress all count the read as the plan does, with the prompt), clear means
clear (the page chips and the viewer go, the range offer hides), a removed set's status goes with it, and "Read
documents" is off once there is nothing new to read. Real SmolLM2, a real PDF."""

from __future__ import annotations

import re

import pytest

from app.browser_state import BrowserState
from app.handlers import Handlers
from engine import DocumentSession, OffloadPolicy

pytestmark = pytest.mark.slow


def _number(html, name: str) -> int:
    return int(re.search(rf'data-{name}="(\d+)"', str(html)).group(1))


def _text(html) -> str:
    return re.sub(r"<[^>]+>", "", str(html))


def test_one_count_per_thing_and_read_off_once_read_and_clear_clears(embedded_model, secret_pdf):
    model, tokenizer = embedded_model
    handlers = Handlers(lambda: DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=32)))
    state = BrowserState()
    chosen = handlers.choose_files([secret_pdf], state)
    read_tokens = len(state.tokens)
    assert read_tokens > sum(state.token_counts)  # the prompt around the file: two counts there were
    assert _number(chosen.plan, "tokens") == _number(chosen.table, "read-tokens") == read_tokens
    assert f"Ready to read {read_tokens:,} tokens" in _text(chosen.status)
    assert f"{read_tokens:,}" in _text(chosen.table)
    assert not re.search(rf"\b{sum(state.token_counts):,} (document )?tokens", _text(chosen.plan))  # no second count

    views = list(handlers.read(False, state))
    assert _number(views[-1].progress, "total") == read_tokens
    assert views[-1].read_button["interactive"] is False  # read to the end: nothing new to read
    # The plan once the read is over says what it took, not the estimate made before it.
    assert "read in" in _text(views[-1].plan) and 'data-read-seconds="' in views[-1].plan
    assert "Reading time" in views[-1].plan and _number(views[-1].plan, "tokens") == read_tokens
    again = handlers.choose_files([secret_pdf], state)  # the same set once more: still nothing new
    assert again.read_button["interactive"] is False and "Already read" in _text(again.status)

    list(handlers.ask("What is the secret launch code of the lighthouse?", [], 16, 0.0, state))
    removed = handlers.choose_files(None, state)  # the file taken out of the box: what was said of it goes
    assert "No files chosen" in _text(removed.status) and "stay loaded" in _text(removed.status)

    handlers.choose_files([secret_pdf], state)
    cleared = handlers.clear(state)
    assert cleared.pages["visible"] is False and cleared.pages["choices"] == []
    assert "Click a page chip" in cleared.page
    assert handlers.range_offer(state).range_box["visible"] is False and state.pieces == []
