"""Answers that did not end where the model ended them say so: "stopped", or "cut at N tokens — raise the limit under
Answer settings" (the real limit), and neither carries "the document may not say" (a part answer is no verdict on the
document). Through the real ``Handlers.ask``; the session yields what a session yields."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from app.browser_state import BrowserState
from app.handlers import Handlers
from app.render import MAY_NOT_SAY
from engine.answer.support import Support
from engine.types import AnswerChunk

UNSURE = Support(document_share=0.05, mean_logprob=-2.5, is_supported=False)


class _Session:
    """A read session whose answer ends as told (``ending``: ``num_tokens``, ``stopped``, ``looped``)."""

    is_prefilled = True
    document, dropped_turns, document_tokens = "", 0, 0

    def __init__(self, **ending):
        self.ending = ending

    def fit_question(self, question, max_new_tokens):
        return SimpleNamespace(num_dropped=0, ids=question.split())

    @property
    def read_time(self):
        return self

    def estimate_prefill_seconds(self, num_tokens, start=0):
        return 0.0

    def conversation(self):  # the turns it recorded: none (the app keeps a turn's notes only for recorded turns)
        return []

    def ask(self, question, **kwargs):
        yield AnswerChunk("The keeper is", "The keeper is", 3, 0.1, 10.0, done=False)
        yield AnswerChunk("The keeper is Mar", "", ttft=0.1, tokens_per_second=10.0, done=True, support=UNSURE,
                          **self.ending)


def _last_answer(max_new_tokens: int, **ending) -> tuple[str, str]:
    """(stats line, the whole answer bubble) of the answer's last update."""
    view = list(Handlers(lambda: None).ask("Who keeps it?", [], max_new_tokens, 0.0,
                                           BrowserState(session=_Session(**ending))))[-1]
    bubble = view.chat[-1]["content"]
    return re.sub(r"<[^>]+>", "", view.status), bubble


def test_an_answer_cut_at_its_limit_says_so_with_the_limit_and_no_support_warning():
    stats, bubble = _last_answer(16, num_tokens=16)
    assert "cut at 16 tokens — raise the limit under Answer settings" in stats, stats
    assert "cut at 16 tokens" in bubble and MAY_NOT_SAY not in bubble and "⚠" not in bubble


def test_a_stopped_answer_says_stopped_and_has_no_support_warning():
    stats, bubble = _last_answer(16, num_tokens=7, stopped=True)
    assert stats.endswith("· stopped"), stats
    assert "cut at" not in stats and MAY_NOT_SAY not in bubble and "⚠" not in bubble


@pytest.mark.parametrize("ending", [{"num_tokens": 7}, {"num_tokens": 16, "looped": True}])
def test_an_answer_the_model_ended_keeps_its_support_warning_and_is_not_called_cut(ending):
    stats, bubble = _last_answer(16, **ending)
    assert "cut at" not in stats and "stopped" not in stats.replace("stopped a repeating loop", "")
    assert MAY_NOT_SAY in bubble and "⚠" in bubble
