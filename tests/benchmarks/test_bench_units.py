"""Pure pieces of the benchmark harness: floors and ratios, resume, search, overlap from a trace."""

from __future__ import annotations

import types

import pytest
import torch

from benchmarks.harness.floors import (Rates, attention_flops, decode_floor_s, linear_params, offloaded_kv_bytes,
                               prefill_flops, prefill_floor_s, ratio)
from benchmarks.harness.models import build_random, llama3_8b_config, tiny_llama_config
from benchmarks.harness.modes import GPU_MODES
from benchmarks.records import ResultStore, latest_by_key
from benchmarks.harness.report import annotate
from benchmarks.harness.search import largest_fitting
from benchmarks.harness.sweeps import Sweep
from benchmarks.harness.trace import merge_intervals, overlap_fraction
from engine.planning.shape import ModelShape

LLAMA3 = ModelShape.from_config(llama3_8b_config())


# -- floors --------------------------------------------------------------------------------------
def test_prefill_flops_match_the_figures_in_gpu_md():
    linear, attention = prefill_flops(LLAMA3, 1 << 20)
    assert linear_params(LLAMA3) == pytest.approx(7.0e9, rel=0.01)  # "2 x 7.0e9 FLOPs per token"
    assert attention == pytest.approx(4 * 4096 * (1 << 20) ** 2 / 2 * 32)
    assert linear + attention == pytest.approx(3.0e17, rel=0.05)  # "at S = 1M that is about 2.8e17" + linear


def test_prefill_floor_uses_each_rate_for_its_part():
    rates = Rates(matmul_tflops=500.0, attention_tflops=250.0)
    linear, attention = prefill_flops(LLAMA3, 40960)
    assert prefill_floor_s(LLAMA3, 40960, rates) == pytest.approx(linear / 500e12 + attention / 250e12)
    assert prefill_floor_s(LLAMA3, 40960, Rates(matmul_tflops=500.0)) is None


def test_decode_floor_is_offloaded_bytes_over_h2d_bandwidth():
    kv = offloaded_kv_bytes(LLAMA3, 1 << 20, LLAMA3.num_layers * LLAMA3.num_kv_heads)
    assert kv == 128 * (1 << 30)  # 128 KiB per token: 1M tokens = 128 GiB
    assert decode_floor_s(kv, Rates(h2d_gbps=25.0)) == pytest.approx(5.5, rel=0.01)
    assert decode_floor_s(0, Rates(h2d_gbps=25.0)) is None and decode_floor_s(kv, Rates()) is None


def test_ratio_and_attention_flops():
    assert ratio(3.0, 2.0) == 1.5 and ratio(None, 2.0) is None and ratio(1.0, 0.0) is None
    assert attention_flops(4, 4, 1, 1) == 4 * 10  # causal square: 4+3+2+1 visible pairs
    assert attention_flops(2, 10, 2, 8) == 4 * 2 * 8 * (2 * 8 + 3)


def test_rates_take_the_best_attention_group():
    rates = Rates.from_metrics({"h2d_gbps": 50.0, "attention_tflops_g1": 300.0, "attention_tflops_g8": 420.0})
    assert rates.attention_tflops == 420.0 and rates.h2d_gbps == 50.0 and rates.matmul_tflops is None


def _record(phase, mode, context, status="ok", device="GPU-A", **metrics):
    return {"phase": phase, "mode": mode, "context": context, "budget_gib": 24.0, "variant": None,
            "status": status, "metrics": metrics, "run": {"gpu": device, "run_id": "r1", "model": None}}


def test_annotate_gives_ratios_to_standard_and_to_floors():
    records = [
        _record("ceilings", None, None, h2d_gbps=50.0, matmul_tflops=500.0, attention_tflops_g1=400.0),
        _record("decode", "standard", 1024, seconds_per_token=0.02),
        _record("decode", "headinfer-g1", 1024, seconds_per_token=0.03, offloaded_kv_bytes=10**9),
        _record("decode", "headinfer-g1", 1024, seconds_per_token=0.025, offloaded_kv_bytes=10**9),  # newer wins
        _record("decode", "headinfer-g1", 1024, device="GPU-B", seconds_per_token=1.0),  # other GPU: no ratio
    ]
    rows = {(r["mode"], r["run"]["gpu"]): r for r in annotate(records)}
    row = rows[("headinfer-g1", "GPU-A")]
    assert row["x_reference"] == pytest.approx(1.25)
    assert row["floor_s"] == pytest.approx(0.02) and row["x_floor"] == pytest.approx(1.25)
    assert rows[("standard", "GPU-A")]["x_reference"] is None
    assert rows[("headinfer-g1", "GPU-B")]["x_reference"] is None


# -- resume --------------------------------------------------------------------------------------
def test_store_resume_counts_final_statuses_on_the_same_device_only(tmp_path):
    store = ResultStore(tmp_path / "r.json", {"gpu": "GPU-A", "run_id": "1"})
    store.append("prefill", "standard", context=1024, budget_gib=24.0, seconds=1.0)
    store.append("prefill", "standard", context=2048, budget_gib=24.0, status="skipped")
    store.append("prefill", "standard", context=4096, budget_gib=24.0, status="oom")
    assert store.is_done("prefill", "standard", 1024, 24.0) and store.is_done("prefill", "standard", 4096, 24.0)
    assert not store.is_done("prefill", "standard", 2048, 24.0)  # skipped for time: retried
    assert not store.is_done("prefill", "standard", 1024, 16.0)
    other = ResultStore(tmp_path / "r.json", {"gpu": "GPU-B", "run_id": "2"})
    assert len(other.records) == 3 and not other.is_done("prefill", "standard", 1024, 24.0)
    assert len(latest_by_key(other.records)) == 3


class _FakeRunner:
    device = torch.device("cpu")


def test_sweep_infers_oom_beyond_a_failure_and_resume_skips_what_is_done(tmp_path):
    calls = []

    def measure(n):
        calls.append(n)
        if n >= 4096:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return {"seconds": n / 1000}

    store = ResultStore(tmp_path / "r.json", {"gpu": "GPU-A", "run_id": "1"})
    sweep = Sweep(_FakeRunner(), store, budget_gib=24.0, resume=True)
    sweep._lengths("prefill", GPU_MODES["standard"], [1024, 2048, 4096, 8192], measure, growth=2)
    assert calls == [1024, 2048, 4096]
    by_context = {r["context"]: r for r in store.records}
    assert by_context[4096]["status"] == "oom" and by_context[8192]["metrics"]["inferred_from"] == 4096
    calls.clear()
    sweep._lengths("prefill", GPU_MODES["standard"], [1024, 2048, 4096, 8192], measure, growth=2)
    assert calls == []


def test_sweep_stops_when_the_projected_time_passes_the_piece_limit(tmp_path):
    clock = types.SimpleNamespace(now=0.0)
    store = ResultStore(tmp_path / "r.json", {"gpu": "GPU-A", "run_id": "1"})
    sweep = Sweep(_FakeRunner(), store, time_limit=100.0)
    import benchmarks.harness.sweeps as sweeps

    def measure(n):
        clock.now += n / 100  # 1024 tokens: 10 s
        return {"seconds": n / 100}

    original = sweeps.time.monotonic
    sweeps.time.monotonic = lambda: clock.now
    try:
        sweep._lengths("prefill", GPU_MODES["chunked"], [1024, 2048, 4096], measure, growth=2)
    finally:
        sweeps.time.monotonic = original
    statuses = [(r["context"], r["status"]) for r in store.records]
    assert statuses == [(1024, "ok"), (2048, "ok"), (4096, "skipped")]  # 4096: ~82 s projected, ~69 s left


# -- search --------------------------------------------------------------------------------------
@pytest.mark.parametrize("answer", [1024, 30_000, 45_311, 700_000])
def test_search_brackets_the_answer_within_resolution(answer):
    result = largest_fitting(lambda n: n <= answer, start=16384, limit=1 << 22, resolution=0.02)
    assert result.largest_ok <= answer
    assert answer - result.largest_ok <= max(1024, 0.02 * result.largest_ok)
    assert result.smallest_failed > answer and not result.is_capped


def test_search_capped_start_failing_and_deadline():
    capped = largest_fitting(lambda n: True, start=4096, limit=65536)
    assert capped.is_capped and capped.largest_ok == 65536 and capped.smallest_failed is None
    nothing = largest_fitting(lambda n: False, start=8192, limit=65536)
    assert nothing.largest_ok == 0 and nothing.smallest_failed == 1024
    ticks = iter(range(100))
    cut = largest_fitting(lambda n: n < 50_000, start=4096, limit=1 << 22, deadline=2, clock=lambda: next(ticks))
    assert cut.is_cut_by_time and len(cut.tried) == 2


# -- overlap from a trace ------------------------------------------------------------------------
def _event(cat, name, ts, dur):
    return {"cat": cat, "name": name, "ts": ts, "dur": dur, "ph": "X"}


def test_overlap_is_h2d_time_covered_by_any_kernel_over_h2d_time():
    events = [
        _event("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 10, 60),  # [10, 70)
        _event("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 0, 200),  # not a fetch: ignored
        _event("kernel", "flash_fwd", 0, 30),  # [0, 30)
        _event("kernel", "gemm", 20, 40),  # [20, 60), another stream: the union is [0, 60)
        _event("kernel", "late", 100, 10),
    ]
    summary = overlap_fraction(events)
    assert summary["h2d_us"] == 60 and summary["h2d_overlapped_us"] == 50
    assert summary["overlap"] == pytest.approx(50 / 60)
    assert summary["kernel_us"] == 70


def test_overlap_without_copies_and_merge():
    assert overlap_fraction([_event("kernel", "k", 0, 5)])["overlap"] is None
    assert merge_intervals([(5, 7), (0, 2), (1, 3), (3, 3)]) == [(0, 3), (5, 7)]


# -- model load: the first-start table -------------------------------------------------------------
def test_first_start_table_keeps_each_codes_newest_run_and_marks_unsampled_peaks():
    from benchmarks.weights.model_load import _first_start_lines

    def record(run_id, label, load, peak, anon=None):
        metrics = {"source": "pypi:m", "load": load, "label": label, "load_peak_mib": peak, "rss_loaded_mib": 1.0,
                   "seconds": 2.0, "load_seconds": 1.0, **({} if anon is None else {"anon_peak_mib": anon})}
        return {"phase": "model-first-start", "status": "ok", "mode": f"{label}pypi:m-{load}", "metrics": metrics,
                "run": {"run_id": run_id, "machine": "vm"}}

    lines = _first_start_lines([record("old", "", "first", 900), record("new", "", "first", 500, anon=200),
                                record("new", "", "first", 700, anon=400), record("b", "before", "first", 800)])
    rows = [line for line in lines if line.startswith("| ") and "`pypi:m`" in line]
    assert rows == ["| this | `pypi:m` | first | 600 | 300 | 1 | 2.0 (1.0) | – | – | – | – | 2 |",  # the newest run
                    "| before | `pypi:m` | first | 800 | – | 1 | 2.0 (1.0) | – | – | – | – | 1 |"]
    later = record("c", "after", "second", 500, anon=300)
    later["metrics"].update(saved=0, cache_mb=1600, gguf_mb=1000, plan_seconds=1.25, panel_seconds=20.0)
    rows = [line for line in _first_start_lines([later]) if "`pypi:m`" in line]
    assert rows == ["| after | `pypi:m` | second | 500 | 300 | 1 | 2.0 (1.0) | no | 2,600 (2.6×) | 1.2 | 20.0 | 1 |"]


# -- the split modes plan with the machine's rates -------------------------------------------------
def test_the_split_mode_plans_its_host_share_from_the_machines_rates_on_cuda(monkeypatch):
    """The H200 run of 2026-11-27 measured "headinfer-g1-split" with a host share of 0: its caches were built
    without the rates the app's plans carry, so every offloaded group streamed. Host 88 GB/s beside a 55 GB/s
    link should put 88 / (88 + 55) of the offloaded bytes on the host; the streamed and host-only modes keep theirs."""
    from benchmarks.harness import modes
    from engine.planning import host_split
    from engine.planning.machine_rates import MachineRates

    asked = []

    def fake_rates(policy, device):
        asked.append((policy.host_attention, torch.device(device).type))
        return MachineRates(host_attention_gbps=88.0, h2d_gbps=55.0, is_h2d_measured=True)

    monkeypatch.setattr(modes, "plan_rates", fake_rates)
    model = build_random(tiny_llama_config(), device="cpu", dtype=torch.bfloat16, attn_implementation="sdpa")
    runner = modes.Runner(model, torch.device("cuda", 0), chunk_size=64)
    by_name = GPU_MODES
    split, streamed, host = (by_name[name] for name in ("headinfer-g1-split", "headinfer-g1", "headinfer-g1-host"))
    # A tiny model's 4K tokens are too few bytes to pay for the host layers' round trips: the planner streams.
    assert runner.plan(split, 4096).host_share == 0.0
    monkeypatch.setattr(host_split, "HOST_LAYER_SECONDS", 0.0)  # free round trips: the plain balance
    assert runner.plan(split, 4096).host_share == pytest.approx(88 / 143)
    assert runner.plan(streamed, 4096).host_share == 0.0
    assert runner.plan(host, 4096).host_share == 1.0
    cache = runner.make_cache(split, 4096)  # construction reads the config only: no CUDA needed to plan
    assert cache.plan.host_share == pytest.approx(88 / 143) and cache.plan.decode_seconds is not None
    assert runner.make_cache(streamed, 4096).plan.host_share == 0.0
    assert set(asked) == {("auto", "cuda")}  # only the split mode asks the machine


def test_the_harness_plans_with_the_dry_run_activation_peak_the_app_measures(monkeypatch):
    """The H200 runs' peak step compared the card against plans made with the paper's activation estimate, which
    they exceeded by up to 0.25 GiB; the app plans with a dry-run chunk's measured peak (``MachineBudget``). On
    CUDA the harness now measures it once too and plans every head-wise cache with it; on a CPU nothing is asked."""
    from benchmarks.harness import modes

    asked = []

    def fake_peak(model, chunk, vocab_size, cuda=None):
        asked.append((chunk, vocab_size, model.config._attn_implementation))
        return 123 << 20

    monkeypatch.setattr(modes, "measure_activation_peak", fake_peak)
    model = build_random(tiny_llama_config(), device="cpu", dtype=torch.bfloat16, attn_implementation="sdpa")
    g1 = GPU_MODES["headinfer-g1"]
    on_cuda = modes.Runner(model, torch.device("cuda", 0), chunk_size=64)
    assert on_cuda.plan(g1, 4096).gpu_breakdown.get("activations") == 123 << 20
    assert on_cuda.make_cache(g1, 4096).plan.gpu_breakdown.get("activations") == 123 << 20
    # measured with head-wise attention (as the app runs it), the model's own attention put back after
    assert set(asked) == {(64, model.config.vocab_size, "headinfer")} and model.config._attn_implementation == "sdpa"
    asked.clear()
    on_cpu = modes.Runner(model, torch.device("cpu"), chunk_size=64)
    assert on_cpu.plan(g1, 4096).gpu_breakdown.get("activations") != 123 << 20 and not asked
    assert on_cpu.make_cache(g1, 4096).plan.gpu_breakdown.get("activations") != 123 << 20 and not asked
