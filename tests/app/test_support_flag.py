"""An answer the document may not support says so beside the text, and still shows where it looked."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.browser_state import BrowserState
from app.handlers import Handlers
from app.render import MAY_NOT_SAY
from engine.types import AnswerChunk, Source, Support


class _Session:
    is_prefilled = True
    document, dropped_turns, document_tokens = "[page 3]\nThe default port is 8080.\n", 0, 0

    def __init__(self, support):
        self.support = support

    def fit_question(self, question, max_new_tokens):
        return SimpleNamespace(num_dropped=0, ids=question.split())  # a ConversationFit's fields

    def count_tokens(self, text):
        return len(text.split())

    @property
    def read_time(self):  # the session's read estimates (``engine.read_time.ReadEstimator``): this fake's own
        return self

    def estimate_prefill_seconds(self, num_tokens, start=0):
        return 0.0

    def conversation(self):  # the turns it recorded: none (the app keeps a turn's notes only for recorded turns)
        return []

    def ask(self, question, **kwargs):
        yield AnswerChunk("The default is 42.", "The default is 42.", 5, 0.1, 10.0, done=False)
        yield AnswerChunk("The default is 42.", "", 5, 0.1, 10.0, done=True, sources=(Source("3", 0.9),),
                          support=self.support)


def _answer(support) -> str:
    state = BrowserState(session=_Session(support))
    return list(Handlers(lambda: None).ask("What is the default?", [], 16, 0.0, state))[-1].chat[-1]["content"]


def test_an_unsupported_answer_is_flagged_beside_its_sources():
    answer = _answer(Support(document_share=0.05, mean_logprob=-2.1, is_supported=False))
    assert "The default is 42." in answer
    assert MAY_NOT_SAY in answer
    assert "p. 3 (90%)" in answer  # where it looked stays
    assert answer.index("may not say this") < answer.index("Sources:")


@pytest.mark.parametrize("support", [Support(0.7, -0.1, True), None])
def test_a_supported_answer_or_one_without_the_signal_carries_no_flag(support):
    answer = _answer(support)
    assert "may not say" not in answer and "p. 3 (90%)" in answer


def test_the_flag_names_the_question_s_words_the_document_never_uses():
    answer = _answer(Support(0.7, -0.1, False, asked_share=0.5, unknown_words=("zsh", "<script>")))
    assert MAY_NOT_SAY in answer and "the document never mentions “zsh”, “&lt;script&gt;”" in answer
    assert "never mentions" not in _answer(Support(0.05, -2.1, False))  # flagged for another reason: no list
