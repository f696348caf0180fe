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
    # The Context meter counts as the plan does: the read's tokens filled, against the context the plan reserved.
    meters, reserved = handlers.meters(state), _number(views[-1].plan, "context-tokens")
    assert f"Context filled / reserved{read_tokens:,} / {reserved:,} tokens" in _text(meters)
    assert f"Context reserved{reserved:,} tokens" in _text(views[-1].plan)
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


def test_a_set_too_large_to_read_whole_is_counted_once_and_nothing_is_said_reserved(embedded_model, tmp_path,
                                                                                    monkeypatch):
    # Issue 51: a too-large file's plan said "11,267 tokens reserved" beside the model's 8,192-token window.
    from make_files import make_pdf

    from engine.read_time.estimator import ReadEstimator

    asked, estimate = [], ReadEstimator.estimate_prefill_range
    monkeypatch.setattr(ReadEstimator, "estimate_prefill_range",
                        lambda self, num_tokens, *rest: asked.append(num_tokens) or estimate(self, num_tokens, *rest))

    filler = "The keeper walked along the harbour wall, counted the boats and wrote the weather in her logbook. " * 9
    pdf = make_pdf(tmp_path / "long-log.pdf", [f"Log page {n}. {filler}" for n in range(50)])
    model, tokenizer = embedded_model
    handlers = Handlers(lambda: DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=256)))
    state = BrowserState()
    chosen = handlers.choose_files([str(pdf)], state)
    read_tokens, plan = len(state.tokens), _text(chosen.plan)
    limit, share = _number(chosen.plan, "limit"), _number(chosen.plan, "documents-share")
    context = _number(chosen.plan, "context-tokens")
    assert read_tokens > limit == 8192 and context > limit and 'data-fits="false"' in chosen.plan
    assert _number(chosen.plan, "tokens") == _number(chosen.table, "read-tokens") == read_tokens
    assert "reserved" not in plan.replace("none reserved", "")  # needed, not reserved: it is not read whole
    assert f"Context needed{context:,} tokens · more than the {limit:,}-token limit" in plan
    assert f"{read_tokens:,} tokens with the prompt, {context:,} with room for answers" in plan
    # The range offer's "at most" is the plan's documents' share, the same count.
    assert f"at most {share:,} tokens fit" in _text(handlers.range_offer(state).range_info)
    assert f"Documents' share{share:,} tokens" in plan
    # Its reading time is that of what "Truncate to fit" reads, the documents' share (was the 8,192-token window's).
    assert asked == [share]
