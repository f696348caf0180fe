"""The wait behind a running answer, on a fake clock: estimated from the answer's own limit, length and rate (not
from the usual answer's length, which once left "1 token", "about 1.0 s" for the 92 s an answer past it still took),
counting down while the visitor waits, and shown in their pending chat bubble as in their status line."""

from __future__ import annotations

import re

import pytest

import app.compute_queue as compute_queue
from app.questions import _waiting
from app.compute_queue import ComputeQueue
from app.render import answer_stats
from app.answer_record import TOWARD_LIMIT, AnswerRecord


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(compute_queue.time, "monotonic", lambda: now[0])
    return now


def _record(*lengths: int, rate: float = 10.0) -> AnswerRecord:
    record = AnswerRecord()
    for length in lengths:
        record.record(length, rate, finish_seconds=0.0, whole_seconds=length / rate)
    return record


def test_an_answer_past_the_usual_length_has_its_limit_ahead_not_one_token():
    record = _record(18, 20, 22)  # the usual answer here: 20 tokens
    assert record.tokens_left(10, 512) == 10  # short of it: the usual length is still what it likely reaches
    left = record.tokens_left(30, 512)  # past every earlier answer: two thirds of the way to its own limit
    assert left == pytest.approx((512 - 30) * TOWARD_LIMIT)
    assert record.tokens_left(30, 64) == pytest.approx((64 - 30) * TOWARD_LIMIT)  # its own limit, not 512
    assert record.seconds_left(30, 512, 4.0) == pytest.approx(left / 4.0)  # at its own rate


def test_an_answer_is_expected_to_reach_the_median_of_the_earlier_answers_longer_than_it():
    record = _record(10, 20, 200, 300, 400)
    assert record.tokens_left(5, 512) == 200 - 5  # all five are longer: their median
    assert record.tokens_left(50, 512) == 300 - 50  # 200, 300, 400 went past 50
    assert record.tokens_left(350, 512) == 400 - 350
    assert record.tokens_left(350, 380) == 30  # never past its own limit
    assert record.tokens_left(512, 512) == 0


def test_before_it_has_a_rate_the_last_answers_rate_is_used_and_their_finishing_time_added():
    record = AnswerRecord()
    assert record.expected_seconds(512) == pytest.approx(20.0)  # nothing timed yet
    record.record(100, 5.0, finish_seconds=2.0, whole_seconds=25.0)
    assert record.seconds_left(0, 512, 0.0) == pytest.approx(100 / 5.0 + 2.0)
    assert record.seconds_left(40, 512, 10.0) == pytest.approx(60 / 10.0 + 2.0)  # its own rate once it has one


def test_the_wait_behind_an_answer_past_the_usual_length_holds_and_falls(clock):
    """The 2026 trial: a second tab saw "about 1.0 s" through a 92 s wait behind an answer past the usual ~20 tokens."""
    record, queue = _record(18, 20, 22, rate=2.5), ComputeQueue()
    answering = queue.join("answering a question", record.expected_seconds(512))
    written, rate = 30, 2.5
    queue.expect(answering, record.seconds_left(written, 512, rate))
    waiting = queue.join("answering a question", record.expected_seconds(512))
    truth = (512 - written) / rate  # it runs to its limit: 193 s
    shown = []
    for _ in range(20):  # a second at a time, a new estimate after each of its tokens
        shown.append(queue.wait_seconds(waiting))
        clock[0] += 1.0
        written += 2
        queue.expect(answering, record.seconds_left(written, 512, rate))
    assert 0.5 * truth <= shown[0] <= 2 * truth, (shown[0], truth)
    assert shown[0] > 60  # not "about 1.0 s"
    downs = sum(later < earlier for earlier, later in zip(shown, shown[1:]))
    assert shown[-1] < shown[0] and downs >= 15, shown


def test_a_waiting_visitor_sees_the_wait_in_the_chat_bubble_and_its_answer_says_how_long_it_waited(clock):
    queue = ComputeQueue()
    queue.join("answering a question", 40.0)
    waiting = queue.join("answering a question", 20.0)
    line = queue.describe(waiting)
    assert "1st in line, about 40 s" in line and waiting.shown_seconds == pytest.approx(40.0)
    bubble = _waiting(queue.position(waiting), waiting.shown_seconds)
    assert re.search(r"1st in line, about 40 s", re.sub(r"<[^>]+>", "", bubble)), bubble
    assert 'data-wait-seconds="40.0"' in bubble
    clock[0] += 15.0
    assert "about 25 s" in _waiting(1, queue.wait_seconds(waiting))  # counted down at the next update
    assert answer_stats(2.45, 31, 13.9, waited=92.0).startswith("TTFT 2.45 s after 1 min 32 s in line · 31 tokens")
    assert answer_stats(2.45, 31, 13.9) == "TTFT 2.45 s · 31 tokens · 13.9 tok/s"  # no wait, nothing said

