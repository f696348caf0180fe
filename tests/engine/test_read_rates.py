"""Honest reading-time estimates: learned from completed reads (kept across starts), shown as a range; the
micro-benchmark only before the first read."""

from __future__ import annotations

import pytest

from engine.prefill import ReadRates, estimate_range


def test_rates_are_kept_across_starts_and_the_nearest_lengths_count(tmp_path):
    path = tmp_path / "read-rates.json"
    rates = ReadRates(path)
    rates.record("m|cpu", 2000, work=100.0, seconds=10.0)  # 10 units/s
    rates.record("m|cpu", 8000, work=1000.0, seconds=200.0)  # 5 units/s: long reads attend more
    rates.record("other|cuda", 2000, work=100.0, seconds=1.0)
    later = ReadRates(path)  # the next start
    assert later.rates("m|cpu", 2100)[0] == pytest.approx(10.0)
    assert later.rates("m|cpu", 7000)[0] == pytest.approx(5.0)
    assert later.rates("nothing|cpu", 2000) == []
    for _ in range(40):
        later.record("m|cpu", 4000, work=1.0, seconds=1.0)
    assert len(ReadRates(path).rates("m|cpu", 4000)) == 5  # the five nearest of the last 24 kept


def test_the_estimate_is_a_range_from_what_reads_took():
    low, likely, high = estimate_range(100.0, [10.0, 8.0, 12.5], benchmark_rate=1.0)
    assert likely == pytest.approx(10.0) and low == pytest.approx(8.0) and high == pytest.approx(12.5)
    low, likely, high = estimate_range(100.0, [10.0], benchmark_rate=1.0)  # one read: at least ±15%
    assert (low, likely, high) == pytest.approx((8.5, 10.0, 11.5))
    low, likely, high = estimate_range(100.0, [], benchmark_rate=4.0)  # before any read: the benchmark, ±50%
    assert (low, likely, high) == pytest.approx((12.5, 25.0, 37.5))
    # A read that will get half the CPU (others keep the cores busy) takes twice as long.
    assert estimate_range(100.0, [10.0], benchmark_rate=1.0, share=0.5)[1] == pytest.approx(20.0)


def test_the_cpu_share_a_read_got_and_will_get():
    from engine.prefill import cpu_share, expected_share

    assert cpu_share(cpu_seconds=20.0, seconds=10.0, num_threads=2) == 1.0
    assert cpu_share(cpu_seconds=6.0, seconds=10.0, num_threads=2) == pytest.approx(0.3)
    assert 0.0 < expected_share(2) <= 1.0


def test_an_unwritable_record_never_fails_a_read(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    rates = ReadRates(blocked / "read-rates.json")  # its folder is a file
    rates.record("m", 100, 1.0, 1.0)
    assert rates.rates("m", 100) == [1.0]  # kept for this start at least


@pytest.mark.slow
def test_a_completed_read_is_recorded_and_the_next_estimate_uses_it(smollm2, tmp_path, monkeypatch):
    from engine import DocumentSession, OffloadPolicy
    from engine import session as session_module

    model, tokenizer = smollm2
    model.set_attn_implementation("headinfer")
    try:
        rates = ReadRates(tmp_path / "read-rates.json")
        rates_share = []
        real_share = session_module.cpu_share
        monkeypatch.setattr(session_module, "cpu_share", lambda *a: rates_share.append(real_share(*a)) or rates_share[0])
        session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=256), answer_budget=64, read_rates=rates)
        session.set_document("The keeper of Kerrow Point climbs the steps every evening. " * 60)
        progress = session.prefill()
        assert progress.elapsed >= 0.5
        monkeypatch.setattr(session_module, "measured_flop_rate", lambda *a: pytest.fail("benchmark after a read"))
        monkeypatch.setattr(session_module, "expected_share", lambda threads: rates_share[0])
        low, likely, high = session.estimate_prefill_range(session.document_tokens)
        assert likely == pytest.approx(progress.elapsed, rel=0.01) and low < likely < high
    finally:
        model.set_attn_implementation("sdpa")
