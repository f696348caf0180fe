"""A huge question is refused by its length before it is tokenized (before: a 10 MB one took 14 s and raised the
app's memory by a GiB in ``count_tokens``), and Gradio's queue refuses a flood of events past its ``max_size``."""

from __future__ import annotations

import time

import pytest

from app.questions import QUESTION_CHARS
from app.browser_state import BrowserState
from app.handlers import Handlers


def _counting(session) -> dict:
    """Counts the session's tokenizing calls (the real ones still run)."""
    calls = {"count_tokens": 0, "fit_question": 0}
    for name in calls:
        real = getattr(session, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)
        setattr(session, name, counted)
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("max_question", [None, 4096])
def test_a_2_mb_question_is_refused_at_once_without_tokenizing(embedded_model, secret_pdf, max_question):
    from engine import DocumentSession, OffloadPolicy

    model, tokenizer = embedded_model
    handlers = Handlers(lambda: DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=64)),
                        max_question=max_question)
    state = BrowserState()
    handlers.choose_files([secret_pdf], state)
    list(handlers.read(False, state))
    calls = _counting(state.session)
    started = time.monotonic()
    views = list(handlers.ask("lighthouse " * 200_000, [], 32, 0.0, state))  # 2.2 MB of text (2,199,999 once stripped)
    assert time.monotonic() - started < 1.0
    assert calls == {"count_tokens": 0, "fit_question": 0}
    assert "Not asked: the question has 2,199,999 characters and this app takes questions of at most" in \
        views[-1].status
    assert views[-1].chat[0]["content"].startswith("lighthouse")  # shown cut short, not whole
    assert len(views[-1].chat[0]["content"]) < 3000
    # A usual question still goes on to the token checks and is asked.
    views = list(handlers.ask("What is the secret launch code?", [], 8, 0.0, state))
    assert calls["fit_question"] == 1 and "Not asked" not in str(views[-1].status)


def test_the_question_box_and_the_queue_have_limits():
    from app.ui import HEAVY_EVENTS, build_ui

    demo = build_ui(lambda: None, model_info={})
    assert demo._queue.max_size == 4 * HEAVY_EVENTS
    boxes = [block for block in demo.blocks.values() if getattr(block, "elem_id", None) == "question"]
    assert boxes and boxes[0].max_length == QUESTION_CHARS
