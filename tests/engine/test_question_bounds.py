"""Questions are bounded and stoppable on the real SmolLM2: one that cannot fit the window is refused before any
work with the numbers; one past the conversation allowance leaves the oldest turns out; a stop while the
question's own tokens are read lands between layers, leaving the cache at the document plus whole chunks."""

from __future__ import annotations

import threading
import time

import pytest

from engine import DocumentSession, OffloadPolicy, QuestionTooLong

pytestmark = pytest.mark.slow

DOCUMENT = "The lighthouse keeper of Kerrow Point is Mara Quill. She climbs 112 steps every evening. " * 8


@pytest.fixture(scope="module")
def model_and_tokenizer(headinfer_smollm2):
    return headinfer_smollm2


@pytest.fixture
def session(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=256), answer_budget=128)
    session.set_document(DOCUMENT)
    session.prefill()
    return session


def test_a_question_past_the_window_is_refused_at_once_with_the_numbers(session):
    question = "Why? " * 20_000  # ~40K tokens: five times SmolLM2's 8,192-token window
    started = time.perf_counter()
    with pytest.raises(QuestionTooLong) as refused:
        next(session.ask(question, max_new_tokens=64))
    assert time.perf_counter() - started < 5
    message = str(refused.value)
    assert "8,192" in message and f"{session.document_tokens:,}" in message
    assert refused.value.question_tokens > 8192 and refused.value.room == session.question_room(64)
    assert session.memory()["context_tokens"] == session.document_tokens  # nothing was read
    assert session.turns == []


def test_the_oldest_turns_are_left_out_past_the_allowance(session):
    for question in ("Who keeps the lighthouse?", "How many steps?"):
        *_, last = session.ask(question, max_new_tokens=40, sources=False)
        assert last.done
    assert len(session.turns) == 2
    # Allowance is the document + 128 tokens: a 100-token question and a 24-token answer leave no room for turns.
    long_question = "Tell me again, in other words, who climbs the steps and how many there are. " * 6
    *_, last = session.ask(long_question, max_new_tokens=24, sources=False)
    assert session.dropped_turns == 2 and [turn.question for turn in session.turns] == [long_question]


def test_stop_while_reading_a_long_question_lands_within_a_second(session):
    question = "Describe the lamp. " * 1200  # ~5K tokens: many seconds to read on a CPU
    stop = threading.Event()
    progress: list[tuple[int, int]] = []

    stopped_at: list[float] = []

    def report(done: int, total: int) -> None:
        progress.append((done, total))
        if len(progress) == 2:  # Stop pressed from another thread shortly after the second chunk
            threading.Timer(0.05, lambda: (stopped_at.append(time.perf_counter()), stop.set())).start()

    chunks = list(session.ask(question, max_new_tokens=16, sources=False, on_question_progress=report,
                              should_stop=stop.is_set))
    latency = time.perf_counter() - stopped_at[0]
    assert latency < 1.0, latency
    assert len(chunks) == 1 and chunks[0].stopped and chunks[0].num_tokens == 0
    assert progress[-1][0] < progress[-1][1]  # the question was not read to its end
    assert session.cache.get_seq_length() == len(session._cached_ids) >= session.document_tokens
    assert session.turns == []
    # The next question works from the kept cache.
    *_, answer = session.ask("Who keeps the lighthouse?", max_new_tokens=16, sources=False)
    assert answer.done and answer.num_tokens > 0
