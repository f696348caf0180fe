"""The GPU benchmark harness on ``--device cuda`` through a strict fake of ``torch.cuda`` (CPU CI).

The first GPU run lost every decode/prefill/peak/max-context step of ``gpu_all`` to one bare ``torch.device("cuda")``
handed to ``set_per_process_memory_fraction``; here every such call refuses a device without an index."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import engine
from benchmarks.harness import run
from benchmarks.harness.models import build_model
from benchmarks.harness.modes import Runner
from benchmarks.records import load_records
from benchmarks.harness.report import write_markdown

from strict_cuda import CONTEXT_BYTES, GIB, CudaOnCpu, FakeNvml, StrictCuda, _Properties


class CpuBackedRunner(Runner):
    """The harness sees ``runner.device == cuda`` (every timing and memory call goes to the fake); the engine's
    caches live on the CPU, where this machine can run them."""

    def make_cache(self, mode, capacity):
        if mode.kind != "headinfer":
            return super().make_cache(mode, capacity)
        cache = engine.HeadInferCache(self.model.config, self.policy(mode, capacity), device="cpu", dtype=self.dtype)
        allocate = cache.allocate
        cache.allocate = lambda batch, head_dim, dtype, device: allocate(batch, head_dim, dtype, torch.device("cpu"))
        return cache


@pytest.fixture
def strict_cuda(monkeypatch):
    fake = StrictCuda().install(monkeypatch)
    monkeypatch.setitem(__import__("sys").modules, "pynvml", FakeNvml([0x3B], [CONTEXT_BYTES + 4 * GIB]))
    monkeypatch.setattr(run, "Runner", CpuBackedRunner)
    monkeypatch.setattr(run, "build_model", lambda name, device: build_model(name, "cpu"))
    monkeypatch.setattr(run, "_MODELS", {})
    with CudaOnCpu():
        yield fake


def test_the_fake_refuses_a_device_without_an_index_as_torch_2_11_does(strict_cuda):
    with pytest.raises(ValueError, match="specified index"):
        torch.cuda.set_per_process_memory_fraction(0.5, torch.device("cuda"))
    with pytest.raises(ValueError, match="specified index"):
        torch.cuda.max_memory_reserved("cuda")
    torch.cuda.set_per_process_memory_fraction(0.5, torch.device("cuda", 0))
    assert strict_cuda.fraction == {0: 0.5}


def test_gpu_steps_run_on_a_cuda_device_through_the_strict_fake(strict_cuda, tmp_path):
    """``gpu_all``'s decode, prefill, peak and max-context steps (through ``run_step``) on ``--device cuda``: the
    budget is set on the indexed card, and every measurement is ok, with the allocator's reserved peak."""
    gpu_all = dataclasses.make_dataclass("Args", ["scale", "device", "model", "budget_gib"])(1.0, "cuda", "tiny", 24.0)
    steps = [["--phases", "decode", "--modes", "standard,headinfer-g1,headinfer-adaptive", "--decode-lengths", "64",
              "--decode-steps", "2", "--repeats", "1", "--chunk-size", "16"],
             ["--phases", "prefill", "--modes", "standard,headinfer-adaptive", "--lengths", "48", "--repeats", "1",
              "--chunk-size", "16"],
             ["--phases", "peak", "--peak-modes", "headinfer-g1", "--peak-lengths", "64", "--chunk-size", "16"],
             ["--phases", "max-context", "--modes", "headinfer-adaptive", "--max-context-limit", "96",
              "--chunk-size", "16"]]
    for step in steps:
        run.run_step(gpu_all, step, _store(tmp_path), tmp_path, 120.0)
    records = load_records(tmp_path / "gpu.json")
    by_phase = {}
    for record in records:
        by_phase.setdefault(record["phase"], []).append(record)
    assert {r["status"] for r in records} == {"ok"}, [(r["phase"], r["mode"], r["metrics"]) for r in records
                                                       if r["status"] != "ok"]
    assert {r["mode"] for r in by_phase["decode"]} == {"standard", "headinfer-g1", "headinfer-adaptive"}
    assert {r["mode"] for r in by_phase["prefill"]} == {"standard", "headinfer-adaptive"}
    assert by_phase["frontier"] and by_phase["max-context"][0]["metrics"]["measured"]
    assert strict_cuda.fraction == {0: pytest.approx(24 / 80)}  # the emulated budget, on card 0
    for record in by_phase["decode"]:
        assert record["metrics"]["decode_peak_reserved"] >= record["metrics"]["decode_peak_allocated"]
    assert all(r["run"]["cuda_context_bytes"] == CONTEXT_BYTES for r in records)  # measured, not assumed
    for record in by_phase["frontier"]:  # the peak checked against the plan three ways
        metrics = record["metrics"]
        planned = metrics["planned_gpu_bytes"]
        assert metrics["over_plan_allocated"] == 3 * GIB - planned
        assert metrics["over_plan_reserved"] == 3 * GIB + (256 << 20) - planned
        assert metrics["over_plan_nvml"] == 4 * GIB - planned
        assert metrics["holds_on_card"] is False  # the fake's peaks are far past a tiny model's plan
    text = write_markdown(records, tmp_path / "gpu.md", title="t")
    assert "within the plan on the card" in text and "| no: allocated +" in text
    called = {name for name, _ in strict_cuda.calls}
    assert {"synchronize", "reset_peak_memory_stats", "max_memory_reserved", "empty_cache"} <= called


def test_nvml_reads_the_card_cuda_names_when_cuda_visible_devices_reorders(monkeypatch):
    """CUDA_VISIBLE_DEVICES=1,0: CUDA's card 0 is NVML's card 1. The handle comes by PCI bus id, not ordinal."""
    from benchmarks.harness.timing import nvml_process_used
    from engine.planning import machine

    cards = [_Properties(name="A", pci_bus_id=0x3B), _Properties(name="B", pci_bus_id=0x86)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    StrictCuda([cards[1], cards[0]]).install(monkeypatch)  # CUDA's order: the second physical card first

    nvml = FakeNvml([0x3B, 0x86], [1_000, 2_000])
    monkeypatch.setitem(__import__("sys").modules, "pynvml", nvml)
    monkeypatch.setattr(machine, "_nvml", lambda: nvml)
    assert nvml_process_used(torch.device("cuda", 0)) == 2_000  # physical card 1 (B)
    assert nvml_process_used(torch.device("cuda")) == 2_000
    assert machine.read_memory(0).gpu_name == "B" and machine.read_memory(1).gpu_name == "A"


def _store(out):
    from benchmarks.records import ResultStore, run_stamp

    return ResultStore(out / "gpu.json", run_stamp("cuda"))


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="set on Linux only")
def test_benchmark_entry_points_set_expandable_segments_before_torch_loads():
    """``python -m benchmarks.harness.run`` / ``benchmarks.gpu.gpu_all``: the package sets the allocator before its modules load
    torch, so the peaks measured are those of the settings the app runs with."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    spy = ("import json, os, sys\nseen = {}\nclass Spy:\n    def find_spec(self, name, path=None, target=None):\n"
           "        if name == 'torch' and not seen:\n"
           "            seen['conf'] = os.environ.get('PYTORCH_CUDA_ALLOC_CONF')\n        return None\n"
           "sys.meta_path.insert(0, Spy())\nimport benchmarks.harness.run\nprint(json.dumps(seen))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    result = subprocess.run([sys.executable, "-c", spy], cwd=Path(__file__).resolve().parents[2], env=env,
                            capture_output=True, text=True, timeout=300)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"conf": "expandable_segments:True"}, result.stderr
