"""The one-call GPU run (``benchmarks/gpu_session.sh`` -> ``benchmarks.gpu.gpu_all``) on a CPU: plumbing, not numbers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from benchmarks.harness import ceilings
from benchmarks.gpu import gpu_all, gpu_steps
from benchmarks.harness.fill import fill_random
from benchmarks.gpu.gpu_summary import summary_table
from benchmarks.harness.modes import GPU_MODES
from benchmarks.harness.probes import host_bytes_needed
from benchmarks.records import load_records

# A fast subset of the smoke run's steps: one of each kind (the ceilings, a check, a sweep, a frontier sweep), the
# earlier leases' steps by name after the lease's own.
SUBSET = ("ceilings", "filled-cache", "decode-1M-int8", "peak")
#: issue 49 item 7's steps on a tiny hybrid (nf4 linear layers, one layer of four with K/V), and the app's
HYBRID = ("hybrid-decode", "hybrid-peak", "hybrid-prefill", "app-e2e")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-smoke")
    gpu_all.main(["--device", "cpu", "--model", "tiny", "--scale", "0.002", "--test-workers", "0", "--out", str(out),
                  "--steps", ",".join(SUBSET), "--deadline-s", "400"])
    return out


def test_every_step_leaves_a_closing_record_and_a_result_of_its_own(smoke):
    records = load_records(smoke / "gpu.json")
    closing = [r for r in records if r["phase"] == "gpu_all"]
    assert [r["mode"] for r in closing] == list(SUBSET)  # in the order of STEPS
    assert all(r["status"] == "done" and r["metrics"]["cap_s"] > 0 for r in closing)
    phases = {r["phase"] for r in records if r["status"] == "ok"}
    assert {"filled-cache", "ceilings", "decode", "frontier"} <= phases
    (one_m,) = [r for r in records if r["phase"] == "decode"]
    assert one_m["mode"] == "headinfer-g1-int8" and one_m["context"] == int((1 << 20) * 0.002)


def test_the_summary_has_one_row_per_step_with_its_figures(smoke):
    text = (smoke / "summary.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| step")]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows] == list(SUBSET)
    assert "host KV budget" in rows[0] and "max rel error" in rows[1] and "s/token" in rows[2]
    assert all(" | ok | " in row for row in rows)


def test_the_step_caps_fit_nine_minutes_and_the_order_puts_the_unmeasured_first():
    assert sum(step.cap_s for step in gpu_all.STEPS) <= 540 - 15  # wheels, environment and the summary besides
    names = [step.name for step in gpu_all.STEPS]
    assert names[:3] == ["self-check", "ceilings", "hybrid-decode"]  # the floors' rates before the first benchmark
    assert names.index("pin-budget") < names.index("gpu-tests") == len(names) - 1
    # issues 49 item 7 and 50 item 6, each a step of the default run; what earlier leases measured, by name only
    assert {"hybrid-decode", "hybrid-peak", "hybrid-prefill", "moe-load-peak", "app-e2e", "pin-budget"} <= set(names)
    assert not set(names) & {step.name for step in gpu_steps.EARLIER_STEPS}
    (decode,) = [step for step in gpu_all.STEPS if step.name == "hybrid-decode"]
    lengths = decode.run_args[decode.run_args.index("--decode-lengths") + 1]
    assert lengths == "128K,512K,1M" and decode.model == "qwen3.6-27b"
    assert "headinfer-g1-split" in decode.run_args[decode.run_args.index("--modes") + 1]


@pytest.fixture(scope="module")
def hybrid_smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-hybrid-smoke")
    gpu_all.main(["--device", "cpu", "--model", "tiny", "--scale", "0.002", "--test-workers", "0", "--out", str(out),
                  "--steps", ",".join(HYBRID), "--deadline-s", "600", "--cap-scale", "6"])  # a loaded CPU
    return out


def test_the_hybrid_steps_measure_the_hybrid_streamed_and_split_and_its_prefill(hybrid_smoke):
    records = load_records(hybrid_smoke / "gpu.json")
    assert [r["mode"] for r in records if r["phase"] == "gpu_all"] == list(HYBRID)
    decode = [r for r in records if r["phase"] == "decode" and r["status"] == "ok"]
    assert {r["mode"] for r in decode} == {"headinfer-g1-split", "headinfer-g1"}
    assert {r["context"] for r in decode} >= {int((1 << 20) * 0.002)}  # "1M", scaled
    for record in decode:  # each record keeps its own model: the 8B's steps later in the run replace no stamp
        model = record["run"]["model"]
        assert model["name"] == "tiny-hybrid" and model["state_layers"] == [0, 1, 2] and model["num_layers"] == 1
        assert model["weight_bytes"] < model["num_params"] * 4  # nf4 linear layers, not fp32 ones
    assert any(r["phase"] == "prefill" and r["status"] == "ok" for r in records)
    assert any(r["phase"] == "frontier" and r["status"] == "ok" for r in records)


def test_the_app_step_names_what_the_machine_lacks_rather_than_passing(hybrid_smoke):
    (app,) = [r for r in load_records(hybrid_smoke / "gpu.json") if r["phase"] == "app-e2e"]
    assert app["status"] == "not-run" and app["metrics"]["reason"]
    row = [line for line in (hybrid_smoke / "summary.md").read_text().splitlines() if line.startswith("| app-e2e")]
    assert " | not run | " in row[0]


def test_summary_names_steps_that_never_ran():
    records = [{"phase": "ceilings", "mode": None, "context": None, "status": "ok", "metrics": {
        "host_pinned_probe_bytes": 4 << 30, "host_pinned_seconds": 3.4, "host_pinned_ok_bytes": 116 << 30}},
        {"phase": "gpu_all", "mode": "ceilings", "context": None, "status": "done",
         "metrics": {"cap_s": 15, "seconds": 9.0}}]
    text = summary_table(records, [("ceilings", 15), ("decode", 90)])
    assert "| ceilings | 15 | 9 | ok | 1 ok | pinned 4.0 GiB in 3.4 s, host KV budget 116 GiB |" in text
    assert "| decode | 90 | – | not run | – | – |" in text


SELF_CHECK_OUTPUT = """\
2026-11-26 18:26:18,069 INFO headinfer.launch: overlap         llama-gqa      float32   ok
2026-11-26 18:26:18,069 INFO headinfer.launch: kv8             gemma3-window  bfloat16  ok
2026-11-26 18:26:18,069 INFO headinfer.launch: disk_tier       llama-gqa      float32   FAILED (PlanError: host memory)
2026-11-26 18:26:18,069 INFO headinfer.launch: h2d_gbps: 53.5 GB/s
2026-11-26 18:26:18,069 INFO headinfer.launch: wrong on this GPU ✗ 2026-11-26 (report: /c/self-check/5.json)
"""


def test_self_check_output_is_parsed_into_cases_rates_and_status():
    parsed = gpu_steps.parse_self_check(SELF_CHECK_OUTPUT)
    assert parsed["num_cases"] == 3 and parsed["num_ok"] == 2
    assert parsed["features"] == ["disk_tier", "kv8", "overlap"]
    assert parsed["not_ok"] == ["disk_tier/llama-gqa/float32: FAILED (PlanError: host memory)"]
    assert parsed["h2d_gbps"] == 53.5 and parsed["status_line"] == "wrong on this GPU ✗ 2026-11-26"


def test_pytest_output_cut_short_is_counted_plain_and_from_xdist_workers():
    log = """\
tests/engine/test_gpu_parity.py::test_a[x] PASSED [  0%]
tests/engine/test_gpu_parity.py::test_b[x] SKIPPED [  1%]
[gw1] [  2%] FAILED tests/engine/kv/test_gpu_kv_core.py::test_c
[gw0] [  3%] PASSED tests/engine/kv/test_gpu_kv_core.py::test_d
FAILED tests/engine/kv/test_gpu_kv_core.py::test_c - AssertionError
"""
    parsed = gpu_steps.parse_pytest_log(log)
    assert (parsed["passed"], parsed["failed"], parsed["skipped"], parsed["tests"]) == (2, 1, 1, 4)
    assert parsed["failures"] == ["tests/engine/kv/test_gpu_kv_core.py::test_c"]


def test_host_budget_comes_from_ram_after_a_small_probe_and_from_the_probe_when_it_fails(monkeypatch):
    result = ceilings.host_capacity(probe_gib=1 / 256, reserve_gib=1, block_gib=1 / 1024, pin=False)
    assert result["host_pinned_probe_bytes"] == 4 << 20  # only the probe is allocated
    assert result["host_pinned_ok_bytes"] == result["host_available_bytes"] - (1 << 30)  # the rest computed

    real_empty, calls = torch.empty, []

    def failing_second(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise RuntimeError("CUDA error: out of memory\nmore")
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(ceilings.torch, "empty", failing_second)
    result = ceilings.host_capacity(probe_gib=1 / 256, reserve_gib=1, block_gib=1 / 1024, pin=False)
    assert result["host_pinned_ok_bytes"] == 1 << 20 and result["host_pinned_failure"] == "CUDA error: out of memory"


def test_a_filled_int8_cache_holds_random_codes_not_zeros():
    from benchmarks.harness.models import tiny_llama_config
    from engine import HeadInferCache

    config = tiny_llama_config()
    cache = HeadInferCache(config, device="cpu", dtype=torch.float32, head_group_size=1, resident_slots=0,
                           max_context=64, kv_dtype="int8")
    fill_random(cache, 48, head_dim=config.head_dim, num_kv_heads=config.num_key_value_heads,
                device=torch.device("cpu"), dtype=torch.float32)
    block = cache.kv_layers[0].homes[0].block(0, 48)  # dequantized
    assert 0.7 < block.float().std() < 1.3  # N(0, 1) through 8-bit codes; an unfilled home reads zeros


def test_eight_bit_and_disk_modes_size_their_pinned_store_from_the_plan():
    runner = SimpleNamespace(is_cuda=True, shape=SimpleNamespace(head_dim=128, dtype_bytes=2),
                             plan=lambda mode, capacity: SimpleNamespace(host_bytes=12345))
    assert host_bytes_needed(runner, GPU_MODES["headinfer-g1-int8"], 1 << 20) == 12345
    assert host_bytes_needed(runner, GPU_MODES["headinfer-g1-int8-disk"], 1 << 20) == 12345


@pytest.mark.parametrize("workers", [0, 2])
def test_each_failures_reason_is_logged_as_it_happens_once_also_under_xdist(tmp_path, workers):
    """A GPU test run cut at its cap never prints pytest's summary (the H200 run of 2026-11-27 lost five reasons):
    ``tests/conftest.py`` appends each failure's report to ``HEADINFER_FAILURE_LOG`` when it happens, once."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "conftest.py").write_text(f"exec(open({str(repo / 'tests' / 'conftest.py')!r}).read())\n")
    (tmp_path / "test_some.py").write_text(
        "def test_fails():\n    assert 2 == 2 * 8, 'two registrations'\n\n"
        "def test_passes():\n    pass\n\n"
        "def test_raises():\n    raise RuntimeError('invalid argument')\n")
    log = tmp_path / "failures.log"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_some.py")]
    if workers:
        command += ["-n", str(workers)]
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"} | {"HEADINFER_FAILURE_LOG": str(log)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH")]))  # conftest's process_env
    subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, timeout=120)
    text = log.read_text()
    reasons = gpu_steps.parse_failure_log(text)
    assert reasons == {"test_some.py::test_fails": "AssertionError: two registrations",
                       "test_some.py::test_raises": "RuntimeError: invalid argument"}
    assert text.count("=== test_some.py::test_fails") == 1


def test_the_pin_budget_step_records_a_refused_pin_then_an_exact_forward_and_both_decodes(tmp_path):
    """The issue-50 step on a CPU (emulated streams): the refusal is sticky and the read after it exact through the
    staging ring; decode fully pinned and staged both measured, and the summary gives their ratio."""
    gpu_all.main(["--device", "cpu", "--model", "tiny", "--scale", "0.002", "--test-workers", "0", "--out",
                  str(tmp_path), "--steps", "pin-budget", "--deadline-s", "900", "--cap-scale", "20"])  # a loaded CPU
    records = [r for r in load_records(tmp_path / "gpu.json") if r["phase"] == "pin-budget"]
    (refused,) = [r for r in records if r["mode"].startswith("failed pin")]
    assert refused["status"] == "ok" and refused["metrics"]["refused"] == "[True, True]"
    assert "greedy tokens identical" in refused["metrics"]["forward"]
    assert "staged fetches" in refused["metrics"]["forward"] and " 0 staged" not in refused["metrics"]["forward"]
    pinned, staged = ([r for r in records if r["mode"] == f"decode {label}"][0] for label in ("pinned", "staged"))
    assert pinned["status"] == staged["status"] == "ok"
    assert pinned["metrics"]["staged_fetches"] == 0 < staged["metrics"]["staged_fetches"]
    assert staged["metrics"]["pinned_peak"] <= staged["metrics"]["pin_limit"] < staged["metrics"]["kv_bytes"]
    (ratio,) = [r for r in records if r["mode"] == "staged / pinned"]
    assert ratio["metrics"]["ratio"] > 0
    assert "staging ring" in (tmp_path / "summary.md").read_text()
