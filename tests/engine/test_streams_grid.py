"""The parity grid on emulated CUDA streams with the happens-before checker on: every family, every mode.

Each case runs a chunked prefill (some interrupted between layers and resumed) and greedy decode steps on
side streams that are worker threads with random delays, and compares every logit with stock transformers;
the checker must have seen the engine's accesses and found no unordered pair. Seeds vary the delays.
"""

from __future__ import annotations

import pytest

from archs import build_pair, tiny_configs
from streams_grid import CASES, max_rel_diff, run

RTOL = 1e-5
SEEDS = (1, 2)


@pytest.fixture(scope="module", params=sorted(tiny_configs()))
def pair(request, tmp_path_factory):
    stock, headinfer = build_pair(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, stock, headinfer


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_emulated_streams_match_stock_with_no_race(pair, case, seed, monkeypatch):
    name, stock, headinfer = pair
    monkeypatch.setenv("HEADINFER_STREAMS_SEED", str(seed))
    outcome = run(stock, headinfer, case)
    assert outcome.races == [], outcome.races
    assert outcome.num_checked > 0  # the engine's buffers went through the checker
    if case.kv_dtype is None:
        assert outcome.same_tokens, (name, case.name)
        assert outcome.max_rel_diff < RTOL, (name, case.name, outcome.max_rel_diff)
    else:  # lossy 8-bit KV: the same answer as the synchronous path's (the CPU-only machine's), not stock's
        reference = run(stock, headinfer, case, streams="sync")
        assert max_rel_diff(outcome, reference) < RTOL, (name, case.name)
