"""The parity grid on emulated CUDA streams with the happens-before checker on: every family, every mode.

Each case runs a chunked prefill (some interrupted between layers and resumed), greedy decode steps and (some)
follow-up steps on side streams that are worker threads with random delays, and compares every logit with
stock transformers; the checker must have seen the engine's accesses and found no unordered pair. Every
family runs every case with one seed; three families (plain, windowed, windowed + global) run a second seed.
"""

from __future__ import annotations

import pytest

from archs import build_pair, tiny_configs
from streams_grid import CASES, kv_bytes, max_rel_diff, run

RTOL = 1e-5
SECOND_SEED_FAMILIES = ("llama-gqa", "mistral-window", "gemma3-window")
GRID = [(family, case, 1) for family in sorted(tiny_configs()) for case in CASES] + [
    (family, case, 2) for family in SECOND_SEED_FAMILIES for case in CASES]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    built = {}

    def get(name):
        if name not in built:
            built[name] = build_pair(name, tmp_path_factory.mktemp(name))
        return built[name]

    return get


@pytest.mark.parametrize("family, case, seed", GRID, ids=[f"{f}-{c.name}-{s}" for f, c, s in GRID])
def test_emulated_streams_match_stock_with_no_race(pairs, family, case, seed, monkeypatch):
    stock, headinfer = pairs(family)
    monkeypatch.setenv("HEADINFER_STREAMS_SEED", str(seed))
    outcome = run(stock, headinfer, case)
    assert outcome.races == [], outcome.races
    assert outcome.num_checked > 0  # the engine's buffers went through the checker
    if case.pin_share is not None:  # pinned within the limit, the rest fetched through the staging ring
        assert outcome.staged_fetches > 0, (family, case.name)
        assert 0 < outcome.pinned_peak <= kv_bytes(headinfer, case) * case.pin_share, (family, case.name)
    if case.kv_dtype is None:
        assert outcome.same_tokens, (family, case.name)
        assert outcome.max_rel_diff < RTOL, (family, case.name, outcome.max_rel_diff)
    else:  # lossy 8-bit KV: the same answer as the synchronous path's (the CPU-only machine's), not stock's
        reference = run(stock, headinfer, case, streams="sync")
        assert max_rel_diff(outcome, reference) < RTOL, (family, case.name)
