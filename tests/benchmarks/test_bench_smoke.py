"""The benchmark harness end to end on CPU (tiny random Llama, the real code paths), no timed assertions."""

from __future__ import annotations

import json

import pytest

from benchmarks.harness import run
from benchmarks.records import load_records

SMOKE_MODES = ("stock", "headinfer", "headinfer-pingpong")


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    run.main(["--cpu-smoke", "--smoke-model", "tiny", "--lengths", "32,64", "--decode-steps", "2",
              "--chunk-size", "16", "--repeats", "1", "--out", str(out)])
    return out


def test_cpu_smoke_writes_one_record_per_mode_length_and_phase(smoke_dir):
    records = load_records(smoke_dir / "cpu-smoke.json")
    measured = {(r["phase"], r["mode"], r["context"]) for r in records if r["status"] == "ok"}
    assert measured == {(phase, mode, n) for phase in ("prefill", "decode") for mode in SMOKE_MODES for n in (32, 64)}
    for record in records:
        assert record["run"]["torch"] and record["run"]["transformers"] and record["run"]["date"]
        assert record["run"]["model"]["name"] == "tiny"
        key = "tokens_per_s"
        assert record["metrics"][key] > 0
    pingpong = [r for r in records if r["mode"] == "headinfer-pingpong"]
    assert all(r["metrics"]["resident_slots"] == 0 for r in pingpong)
    resident = [r for r in records if r["mode"] == "headinfer"]
    assert all(r["metrics"]["resident_slots"] == r["metrics"]["total_slots"] for r in resident)


def test_cpu_smoke_writes_markdown_and_plots(smoke_dir):
    text = (smoke_dir / "cpu-smoke.md").read_text()
    assert "## Prefill" in text and "## Decode" in text and "× stock" in text
    for mode in SMOKE_MODES:
        assert f"| {mode} | 64 |" in text
    pytest.importorskip("matplotlib")
    assert (smoke_dir / "cpu-smoke-prefill.png").stat().st_size > 0
    assert (smoke_dir / "cpu-smoke-decode.png").stat().st_size > 0


def test_cpu_smoke_resume_appends_nothing_when_everything_is_done(smoke_dir):
    before = (smoke_dir / "cpu-smoke.json").read_text()
    run.main(["--cpu-smoke", "--smoke-model", "tiny", "--lengths", "32,64", "--decode-steps", "2",
              "--chunk-size", "16", "--repeats", "1", "--out", str(smoke_dir), "--resume"])
    assert json.loads((smoke_dir / "cpu-smoke.json").read_text()) == json.loads(before)


def test_gpu_pieces_run_on_cpu_with_a_tiny_model(tmp_path, caplog):
    """The GPU sweeps (prefill, decode, frontier, profile) through the CLI, on CPU: code paths, not numbers."""
    args = ["--device", "cpu", "--model", "tiny", "--phases", "prefill,decode,peak,profile",
            "--modes", "standard,chunked,headinfer-g2,headinfer-adaptive", "--lengths", "32,64",
            "--decode-lengths", "64", "--peak-lengths", "64", "--peak-modes", "headinfer-g1",
            "--profile-context", "64", "--chunk-size", "16", "--repeats", "1", "--decode-steps", "2",
            "--out", str(tmp_path)]
    run.main(args)
    records = load_records(tmp_path / "gpu.json")
    ok = {(r["phase"], r["mode"], r["context"]) for r in records if r["status"] == "ok"}
    for mode in ("standard", "chunked", "headinfer-g2", "headinfer-adaptive"):
        assert {("prefill", mode, 32), ("prefill", mode, 64), ("decode", mode, 64)} <= ok
    assert ("frontier", "headinfer-g1", 64) in ok and ("profile", "headinfer-g1", 64) in ok
    g2 = next(r for r in records if r["mode"] == "headinfer-g2" and r["phase"] == "decode")
    assert g2["metrics"]["head_group_size"] == 2 and g2["metrics"]["resident_slots"] == 0
    text = (tmp_path / "gpu.md").read_text()
    assert "## Prefill" in text and "× standard" in text and "GPU peak vs context" in text
    assert (tmp_path / "profile.txt").read_text().startswith("## decode_step")

    run.main(["--out", str(tmp_path), "--report-only"])  # the report is rebuilt from the JSON alone
    assert (tmp_path / "gpu.md").read_text() == text

    with caplog.at_level("INFO", logger="benchmarks.harness.run"):
        run.main(args + ["--resume"])  # everything recorded: no model is even built
    assert load_records(tmp_path / "gpu.json") == records
    assert "nothing left to measure" in caplog.text


def test_parse_tokens():
    assert run.parse_tokens("1K,10K, 512,1M,1.5K") == [1024, 10240, 512, 1 << 20, 1536]


def test_record_junit_appends_a_parity_record(tmp_path):
    xml = tmp_path / "parity.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest" tests="4" failures="1" errors="0" skipped="1" time="2.5">'
        '<testcase classname="tests.engine.test_gpu_parity" name="test_a"/>'
        '<testcase classname="tests.engine.test_gpu_parity" name="test_b"><failure message="x"/></testcase>'
        '<testcase classname="tests.engine.test_gpu_parity" name="test_c"><skipped/></testcase>'
        '<testcase classname="tests.engine.test_gpu_parity" name="test_d"/>'
        "</testsuite></testsuites>")
    run.main(["--out", str(tmp_path), "--device", "cpu", "--record-junit", str(xml)])
    (record,) = load_records(tmp_path / "gpu.json")
    assert record["phase"] == "parity"
    assert record["metrics"].items() >= {"tests": 4, "failed": 1, "skipped": 1, "passed": 2}.items()
    assert record["metrics"]["failures"] == ["tests.engine.test_gpu_parity::test_b"]
    assert run.main(["--out", str(tmp_path), "--device", "cpu", "--is-done", "parity"]) == 0
    assert run.main(["--out", str(tmp_path), "--device", "cpu", "--is-done", "ceilings"]) == 1
