"""The repetition guard: a sampling choice that stops loops; off, greedy decoding is untouched."""

from __future__ import annotations

import pytest
import torch

from engine.answer.sampling import RepetitionGuard


def test_a_tail_repeated_three_times_is_a_loop():
    guard = RepetitionGuard()
    command = [11, 12, 13, 14, 15]
    assert guard.loop_span([1, 2] + command * 3) == 5
    assert guard.loop_span([1, 2] + command * 2) == 0  # twice may be legitimate (a list, a quote)
    assert guard.loop_span([7, 7, 7, 7, 7, 7, 7, 7, 7]) == 3  # shortest span that repeats wins
    assert guard.loop_span(list(range(40))) == 0


def test_penalty_touches_only_the_answers_recent_tokens():
    guard = RepetitionGuard(penalty=2.0, window=2)
    logits = torch.tensor([4.0, -4.0, 4.0, 1.0])
    adjusted = guard.adjust(logits, answer_ids=[2, 0, 1])  # window keeps [0, 1]
    assert adjusted.tolist() == [2.0, -8.0, 4.0, 1.0]
    assert logits.tolist() == [4.0, -4.0, 4.0, 1.0]  # the caller's logits are not modified
    assert torch.equal(RepetitionGuard(penalty=1.0).adjust(logits, [0, 1]), logits)


@pytest.mark.parametrize("kwargs", [dict(penalty=0.5), dict(repeats=1), dict(min_span=0), dict(min_span=9, max_span=4)])
def test_invalid_guards_are_refused(kwargs):
    with pytest.raises(ValueError):
        RepetitionGuard(**kwargs)
