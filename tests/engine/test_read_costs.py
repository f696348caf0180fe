"""Honest reading-time estimates from the chunk timings of real reads: the rate's shape (a linear and a
quadratic-in-context term) scaled to the reads (``read_model.calibrated``), by a load probe taken now against the
one taken when the reads were recorded, shown as a range from how well the scale predicts held-out reads."""

from __future__ import annotations

import json
import random

import pytest

from engine.read_time.costs import Chunk, CostFit, LoadProbe, Probe, ReadCosts, pairs
from engine.read_time.read_model import calibrated
from engine.read_time.read_rate import ReadRate

A, B = 1e-3, 1e-6  # seconds per token, per (query, key) pair: at 8K tokens attention is 4x the linear cost


def timed_read(num_tokens: int, chunk: int = 512, load: float = 1.0, noise: float = 0.0,
               rng: random.Random | None = None) -> list[Chunk]:
    """A read's chunks timed by the true cost ``A·q + B·pairs``, ``load`` times slower, with multiplicative noise."""
    chunks = []
    for position in range(0, num_tokens, chunk):
        size = min(chunk, num_tokens - position)
        seconds = (A * size + B * (pairs(position + size) - pairs(position))) * load
        if noise:
            seconds *= 1 + rng.uniform(-noise, noise)
        chunks.append(Chunk(position, size, seconds))
    return chunks


def truth(num_tokens: int, load: float = 1.0) -> float:
    return (A * num_tokens + B * pairs(num_tokens)) * load


def probe(seconds: float, spread: float = 0.0) -> Probe:
    return Probe(seconds, spread, at=0.0)


SHAPE = ReadRate(0.0, A * 3.0, B * 3.0, probe_seconds=1.0)  # the right split, a wrong scale: the reads calibrate it


def estimate(costs: ReadCosts, key: str, start: int, stop: int, now: Probe, shape: ReadRate = SHAPE,
             exponent: float = 1.0):
    """What the session's estimator makes of ``costs``'s reads for ``key``; None before any read."""
    model = calibrated(shape, costs.timed_reads(key), exponent)
    return model.estimate(0, start, stop, now) if model.reads else None


def test_the_fit_recovers_the_linear_and_the_quadratic_cost():
    points = [(*c.features, c.seconds) for c in timed_read(2000) + timed_read(6000, chunk=700)]
    fit = CostFit.of(points)
    assert fit.per_token == pytest.approx(A, rel=1e-6) and fit.per_pair == pytest.approx(B, rel=1e-6)
    # Chunking does not change what a read costs.
    assert fit.cost(0, 8000) == pytest.approx(truth(8000), rel=1e-6)


def test_the_fit_never_goes_negative():
    # Times that fall with context would need a negative per-pair cost: the per-pair term is dropped instead.
    points = [(512.0, pairs(p + 512) - pairs(p), 1.0 - p * 1e-5) for p in range(0, 8192, 512)]
    fit = CostFit.of(points)
    assert fit.per_token > 0 and fit.per_pair == 0.0
    assert CostFit.of([]) is None


def test_a_single_rate_from_short_reads_would_underestimate_a_long_one_the_fit_does_not(tmp_path):
    costs = ReadCosts(tmp_path / "costs.json")
    costs.record("m", timed_read(2000), probe_seconds=1.0)
    costs.record("m", timed_read(4000), probe_seconds=1.0)
    low, likely, high = estimate(costs, "m", 0, 7000, probe(1.0))
    assert likely == pytest.approx(truth(7000), rel=1e-6)
    single_rate = 4000 / truth(4000)  # tokens/s of the 4K read, as the old estimate extrapolated
    assert 7000 / single_rate < 0.8 * truth(7000)


def test_the_load_probe_scales_the_estimate(tmp_path):
    costs = ReadCosts(tmp_path / "costs.json")
    costs.record("m", timed_read(3000), probe_seconds=0.1)  # recorded on a quiet machine
    costs.record("m", timed_read(5000, load=2.0), probe_seconds=0.2)  # under twice the load: probe twice as slow
    quiet = estimate(costs, "m", 0, 4000, probe(0.1))
    busy = estimate(costs, "m", 0, 4000, probe(0.25))
    assert quiet[1] == pytest.approx(truth(4000), rel=1e-6)
    assert busy[1] == pytest.approx(2.5 * truth(4000), rel=1e-6)
    assert busy[0] > quiet[0] and busy[2] > quiet[2]
    # A resumed read: only the rest, which attends the most keys.
    assert estimate(costs, "m", 3000, 4000, probe(0.1))[1] == pytest.approx(truth(4000) - truth(3000), rel=1e-6)


def test_the_range_contains_the_truth_for_noisy_reads(tmp_path):
    """Reads whose load the probe catches only roughly (±20% per read) and whose chunks jitter (±15%): the range
    shown before a new read holds its actual time in at least 9 of 10 trials, and is not cosmetically wide."""
    rng = random.Random(7)
    inside, widths = 0, []
    for trial in range(40):
        costs = ReadCosts(None)
        for num_tokens in (1500, 3000, 5000, 2500):
            load = rng.uniform(0.5, 3.0)
            probe_error = rng.uniform(-0.2, 0.2)
            costs.record("m", timed_read(num_tokens, load=load, noise=0.15, rng=rng),
                         probe_seconds=0.1 * load * (1 + probe_error))
        load = rng.uniform(0.5, 3.0)
        actual = sum(c.seconds for c in timed_read(6000, load=load, noise=0.15, rng=rng)) * (1 + rng.uniform(-0.2, 0.2))
        low, likely, high = estimate(costs, "m", 0, 6000, probe(0.1 * load, spread=0.05))
        inside += low <= actual <= high
        widths.append(high / low)
    assert inside >= 36
    assert sorted(widths)[len(widths) // 2] < 2.2  # the median range: at most about -30% / +50%


def test_one_read_gives_a_range_of_at_least_25_percent(tmp_path):
    costs = ReadCosts(None)
    costs.record("m", timed_read(3000), probe_seconds=1.0)
    low, likely, high = estimate(costs, "m", 0, 3000, probe(1.0))
    assert likely == pytest.approx(truth(3000), rel=1e-6)
    assert low == pytest.approx(0.75 * likely) and high == pytest.approx(1.25 * likely)
    assert estimate(costs, "other", 0, 3000, probe(1.0)) is None  # another model, device or policy: nothing yet


def test_timings_are_kept_across_starts_and_an_unwritable_record_never_fails_a_read(tmp_path):
    path = tmp_path / "read-costs.json"
    ReadCosts(path).record("m|cpu", timed_read(2000), probe_seconds=0.5)
    later = ReadCosts(path)  # the next start
    assert estimate(later, "m|cpu", 0, 2000, probe(0.5))[1] == pytest.approx(truth(2000), rel=1e-6)
    for _ in range(40):
        later.record("m|cpu", timed_read(1000), probe_seconds=0.5)
    assert len(ReadCosts(path).reads("m|cpu")) == 24
    path.write_text('{"m|cpu": [[2000, 5.0, 0]]}')  # the old read-rates format: ignored, not a crash
    assert estimate(ReadCosts(path), "m|cpu", 0, 2000, probe(1.0)) is None
    blocked = tmp_path / "file"
    blocked.write_text("")
    costs = ReadCosts(blocked / "read-costs.json")  # its folder is a file
    costs.record("m", timed_read(1000), 1.0)
    assert estimate(costs, "m", 0, 1000, probe(1.0)) is not None  # kept for this start at least


def test_the_probe_is_short_reused_while_fresh_and_while_this_process_computes():
    load = LoadProbe("cpu", max_age=60.0)
    first = load.measure()
    assert 0 < first.seconds < 2.0 and first.spread >= 0  # ~0.1-0.3 s here; a busy shared VM stretches it
    assert load.current().seconds == first.seconds and len(load._history) == 1
    load.max_age = 0.0
    with load.computing():
        load.current()
        assert len(load._history) == 1  # our own read would be mistaken for others' load
    load.current()
    assert len(load._history) == 2


def test_the_load_is_the_median_of_the_recent_probes_and_their_spread_widens_the_range():
    load = LoadProbe("cpu", max_age=60.0, window=300.0)
    load._history = [Probe(0.1, 0.02, at=-1e9), Probe(0.1, 0.02, 1e9 - 2), Probe(0.3, 0.02, 1e9 - 1),
                     Probe(0.2, 0.02, 1e9)]  # the first is older than the window
    import time as clock
    real = clock.monotonic
    try:
        clock.monotonic = lambda: 1e9 + 1
        now = load.current()
    finally:
        clock.monotonic = real
    assert now.seconds == pytest.approx(0.2) and now.spread == pytest.approx(0.5)
    costs = ReadCosts(None)
    costs.record("m", timed_read(3000), probe_seconds=0.2)
    costs.record("m", timed_read(4000), probe_seconds=0.2)
    steady = estimate(costs, "m", 0, 4000, probe(0.2, spread=0.02))
    changing = estimate(costs, "m", 0, 4000, now)
    assert changing[1] == pytest.approx(steady[1])
    assert changing[0] < steady[0] and changing[2] > steady[2]


@pytest.mark.slow
def test_a_read_records_its_chunks_and_the_next_estimate_uses_them(smollm2, tmp_path, monkeypatch):
    from engine import DocumentSession, OffloadPolicy
    from engine.read_time import estimator as estimator_module

    model, tokenizer = smollm2
    model.set_attn_implementation("headinfer")
    try:
        costs = ReadCosts(tmp_path / "read-costs.json")
        session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=128), answer_budget=64, read_costs=costs)
        session.set_document("The keeper of Kerrow Point climbs the steps every evening. " * 60)
        progress = session.prefill()
        [read] = costs.reads(session.read_time.costs_key)
        assert len(read) == -(-session.document_tokens // 128)  # every chunk
        assert sum(x for x, _, _ in read) == session.document_tokens
        monkeypatch.setattr(estimator_module, "measure_read_rate", lambda *a: pytest.fail("benchmark after a read"))
        low, likely, high = session.read_time.estimate_prefill_range(session.document_tokens)
        assert low < likely < high
        assert likely == pytest.approx(progress.elapsed, rel=0.6)  # the same read, at about the same load
    finally:
        model.set_attn_implementation("sdpa")


@pytest.mark.slow
def test_a_read_gives_way_between_layers_on_a_cpu_untimed_and_a_cancel_there_lands_at_once(smollm2, tmp_path):
    import time

    from engine import DocumentSession, OffloadPolicy, PrefillCancelled

    model, tokenizer = smollm2
    model.set_attn_implementation("headinfer")
    try:
        path = tmp_path / "read-costs.json"
        session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=128), answer_budget=64,
                                  read_costs=ReadCosts(path))
        session.set_document("The keeper of Kerrow Point climbs the steps every evening. " * 30)
        cancel = []
        with pytest.raises(PrefillCancelled):
            session.prefill(should_stop=lambda: bool(cancel), give_way=lambda: (time.sleep(0.5), cancel.append(True)))
        assert session.prefilled_tokens == 0  # stopped inside the first forward, right after its first pause
        pauses = []

        def give_way():
            started = time.perf_counter()
            time.sleep(0.02)
            pauses.append(time.perf_counter() - started)

        started = time.perf_counter()
        progress = session.prefill(give_way=give_way)
        wall = time.perf_counter() - started
        num_chunks = -(-session.document_tokens // 128)
        layers = model.config.num_hidden_layers
        assert len(pauses) == num_chunks * (layers - 1) + num_chunks - 1  # between layers and between chunks
        assert progress.elapsed < wall - sum(pauses) + 0.05  # the pauses are not reading
        [read] = json.loads(path.read_text())["reads"][session.read_time.costs_key]
        assert sum(seconds for _, _, seconds, _ in read["chunks"]) < wall - 0.9 * sum(pauses)  # chunks timed unpaused
        assert session.is_prefilled
    finally:
        model.set_attn_implementation("sdpa")


def test_the_first_reads_benchmark_runs_a_forward_the_way_a_read_does(tmp_path, monkeypatch):
    """Before any read, the estimate's benchmark forward goes through a head-wise cache of its own (released after)
    and keeps the last logit only, as a read does: a cacheless forward computing every position's logits ran 2.4x
    slower than a read here, and first estimates came out +130-180%."""
    from archs import build_pair

    from engine import DocumentSession, HeadInferCache, OffloadPolicy
    from engine.read_time import estimator as estimator_module

    _, model = build_pair("llama-gqa", tmp_path / "tiny")  # a fresh model: no rate measured for it yet
    made, calls = [], []

    class Counted(HeadInferCache):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    forward = model.forward

    def recording(*args, **kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))  # transformers >= 5.24 takes cache=
        calls.append((type(cache).__name__, kwargs.get("logits_to_keep")))
        return forward(*args, **kwargs)

    monkeypatch.setattr(estimator_module, "HeadInferCache", Counted)
    monkeypatch.setattr(model, "forward", recording)
    session = DocumentSession(model, None, OffloadPolicy(), read_costs=ReadCosts(None))
    session.read_time.measure_read_rate_in_background().join()
    low, likely, high = session.read_time.estimate_prefill_range(2000)
    assert 0 < low < likely < high and not session.read_time.estimate_prefill_range(2000).provisional
    assert calls and all(call == ("Counted", 1) for call in calls)  # warm-up and the timed forwards
    assert made and all(cache.get_seq_length() == 0 for cache in made)  # each released afterwards


def test_one_read_in_one_chunk_scales_the_rates_shape_and_predicts_a_longer_read():
    """A read done in one forward is one point: it cannot split the two terms, so it scales the rate's shape (the
    measured one, or the planner's FLOP model), which predicts the next, longer read."""
    costs = ReadCosts(None)
    costs.record("m", timed_read(2000, chunk=4096), probe_seconds=1.0)
    assert estimate(costs, "m", 0, 4000, probe(1.0))[1] == pytest.approx(truth(4000), rel=1e-6)


def test_no_bound_of_a_range_is_ever_negative_however_the_load_swings(tmp_path):
    """A 2-page PDF once showed "≈ 36 s (-0.8 s – 2 min 22 s)": the load's spread was taken off as ``1 - spread``,
    below zero once the probes swung more than 2x. Now it divides: a factor either way."""
    from app.render import reading_time

    costs = ReadCosts(None)
    costs.record("m", timed_read(1000), probe_seconds=0.02)
    before_any_read = calibrated(SHAPE, [], 1.0)
    for spread in (0.0, 0.5, 1.0, 1.6, 5.0):
        for shown in (estimate(costs, "m", 0, 800, probe(0.05, spread)), before_any_read.estimate(0, 0, 800,
                                                                                                   probe(1.0, spread))):
            low, likely, high = shown
            assert 0 < low < likely < high, (spread, shown)
            assert "-" not in reading_time(shown)
    low, _, high = estimate(costs, "m", 0, 800, probe(0.05, 1.6))
    assert high / low > 2.6 ** 2  # a swinging load still widens the range: both ways
