"""The self-check: every enabled feature through the real stream path vs stock, its report, and turning a failing
feature off. On a CPU it runs on emulated streams (``OffloadPolicy(streams="emulated")``)."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
import torch

import engine
from engine import OffloadPolicy
from engine.selfcheck import report as selfcheck
from engine.kv.host_attention import HostAttention
from engine.selfcheck.cases import compare


@pytest.fixture(scope="module")
def full_report(tmp_path_factory):
    """A CPU self-check of every feature (host attention, int8 KV, the disk tier), every tiny architecture."""
    folder = tmp_path_factory.mktemp("cache")
    policy = OffloadPolicy(kv_dtype="int8", disk_dir=str(tmp_path_factory.mktemp("disk")))
    return policy, folder, selfcheck.run_self_check(policy, "cpu", folder=folder)


def test_every_enabled_feature_is_exact_on_emulated_streams_and_the_report_is_stored(full_report):
    policy, folder, report = full_report
    assert report.streams == "emulated" and report.device == "cpu"
    assert {(case.feature, case.arch) for case in report.cases} == {
        (feature, arch) for feature in ("overlap", "host_attention", "kv8", "disk_tier")
        for arch in ("llama-gqa", "gemma3-window")} | {("overlap", "qwen3-moe")}  # the MoE's: weights, one case
    assert all(case.passed and case.tokens_equal for case in report.cases), report.cases
    assert all(case.max_rel_error < 1e-4 for case in report.cases)
    assert report.passed and report.failed == []
    assert report.status_line().startswith("exact on this CPU (emulated streams) ✓ ")
    stored = json.loads(selfcheck.report_path(selfcheck.identity(policy, torch.device("cpu")), folder).read_text())
    assert stored["failed"] == [] and stored["identity"]["features"] == ["overlap", "host_attention", "kv8",
                                                                         "disk_tier"]
    assert selfcheck.cached_report(policy, "cpu", folder) == report  # read back whole


def test_the_report_is_per_identity_and_a_cpu_start_up_never_runs_it(full_report, tmp_path):
    policy, folder, _ = full_report
    assert selfcheck.cached_report(OffloadPolicy(), "cpu", folder) is None  # other features: another report
    assert selfcheck.first_use(policy, "cpu", tmp_path) is None  # CPU start-up stays fast
    assert not any(tmp_path.iterdir())


def test_a_wrong_host_kernel_fails_host_attention_alone_which_is_turned_off(monkeypatch, tmp_path, caplog):
    real_start = HostAttention.start

    class WrongJob:  # the host's result 5 % off: what a missing wait or a bad kernel would return
        def __init__(self, job):
            self._job = job

        def __getattr__(self, name):
            return getattr(self._job, name)

        def result(self):
            return self._job.result() * 1.05

    monkeypatch.setattr(HostAttention, "start", lambda self, *a, **k: WrongJob(real_start(self, *a, **k)))
    policy = OffloadPolicy(host_attention="auto")
    report = selfcheck.run_self_check(policy, "cpu", folder=tmp_path, archs=("llama-gqa",))
    assert report.failed == ["host_attention"]
    assert "host_attention" in report.status_line() and "✓" not in report.status_line()
    assert json.loads(next((tmp_path / "self-check").glob("*.json")).read_text())["failed"] == ["host_attention"]
    with caplog.at_level(logging.WARNING, logger="engine.selfcheck.report"):
        safe = selfcheck.disable(policy, report.failed)
    assert safe.host_attention == "off" and safe.overlap
    assert "host attention" in caplog.text and "streamed" in caplog.text


def test_a_crashing_feature_fails_with_its_error_and_the_rest_runs_without_overlap(monkeypatch, tmp_path):
    """An exception in the overlapped path fails ``overlap``; the other features are then checked without it."""
    from engine.kv import schedule

    real_prefetch = schedule.Schedule._prefetch_after

    def crash_when_overlapping(self, *args, **kwargs):
        if self.overlap:
            raise RuntimeError("injected")
        return real_prefetch(self, *args, **kwargs)

    monkeypatch.setattr(schedule.Schedule, "_prefetch_after", crash_when_overlapping)
    report = selfcheck.run_self_check(OffloadPolicy(kv_dtype="int8"), "cpu", folder=tmp_path, archs=("llama-gqa",))
    assert report.failed == ["overlap"]
    assert "RuntimeError: injected" in report.cases[0].error
    assert not selfcheck.disable(OffloadPolicy(), report.failed).overlap


def test_a_case_that_cannot_be_set_up_is_not_checked_and_its_feature_stays_on(monkeypatch, tmp_path, caplog):
    """The first GPU: the disk-tier case's caches were refused by the planner (a fault of the check's sizing), the
    tier was reported wrong, turned off and remembered. A set-up failure says "not checked", never "wrong"."""
    from engine.errors import PlanError
    from engine.selfcheck import cases

    def refused(pair, policy, workdir):
        raise PlanError("host memory: the offloaded KV cache needs 32.0 MiB but the budget is 0.0 MiB")

    monkeypatch.setattr(cases, "_with_disk_tier", refused)
    policy = OffloadPolicy(disk_dir=str(tmp_path / "disk"), host_attention="off")
    report = selfcheck.run_self_check(policy, "cpu", folder=tmp_path, archs=("llama-gqa",))
    assert report.failed == [] and report.passed  # not "wrong": nothing is turned off
    disk = [case for case in report.cases if case.feature == "disk_tier"]
    assert [(case.checked, case.passed) for case in disk] == [(False, False)] and "PlanError" in disk[0].error
    assert [case.passed for case in report.cases if case.feature == "overlap"] == [True]
    assert report.unchecked == ["disk_tier"]
    assert "not checked: disk_tier" in report.status_line() and "wrong" not in report.status_line()
    with caplog.at_level(logging.WARNING, logger="engine.selfcheck.report"):
        kept = selfcheck.disable(policy, selfcheck.cached_report(policy, "cpu", tmp_path).failed)
    assert kept == policy and "disk tier" not in caplog.text  # the tier stays on, on this start and the next
    stored = json.loads(next((tmp_path / "self-check").glob("*.json")).read_text())
    assert stored["failed"] == [] and stored["unchecked"] == ["disk_tier"]


@pytest.mark.parametrize("arch", ["llama-gqa", "gemma3-window"])
def test_the_disk_tier_case_budgets_the_disk_streams_pinned_buffers_on_cuda(tmp_path, arch):
    """Planned as on CUDA (where the disk stream's 32 MiB of pinned pieces and write buffers are host memory): the
    case's budget fits and leaves homes on disk; the hand-made budget of the first GPU run was refused."""
    from engine.planning.planner import make_plan
    from engine.planning.shape import ModelShape
    from engine.selfcheck import cases

    pair = cases.TinyPair.build(arch, torch.bfloat16, torch.device("cpu"))
    policy = cases.case_policy("disk_tier", OffloadPolicy(), "emulated")
    probe = cases._cache(pair, policy)  # every home offloaded (resident_slots=0): on CUDA all are host homes
    probe.allocate(1, probe.shape.head_dim, pair.dtype, pair.device)
    kv, shape = probe.kv_bytes()["host"], probe.shape
    probe.release()
    assert isinstance(shape, ModelShape)
    tiered = cases.disk_tier_policy(shape, policy, kv, tmp_path, device_is_cuda=True)
    plan = make_plan(shape, tiered, cases.CONTEXT, device_is_cuda=True)
    assert plan.fits and 0 < plan.disk_slots < plan.total_slots, plan.reason
    in_ram = make_plan(shape, policy, cases.CONTEXT, device_is_cuda=True).host_bytes
    by_hand = dataclasses.replace(tiered, host_memory=max(1, in_ram - kv // 2))  # the old sizing
    assert not make_plan(shape, by_hand, cases.CONTEXT, device_is_cuda=True).fits


def test_greedy_tokens_are_compared_up_to_a_near_tie_of_the_reference():
    reference = ([torch.tensor([0.0, 5.0, 1.0]), torch.tensor([3.0, 3.0, 0.0]), torch.tensor([1.0, 0.0, 0.0])],
                 [1, 0])
    same = ([t.clone() for t in reference[0]], [1, 1])  # differs only after the tie at step 1
    assert compare(same, reference, 1e-4) == (0.0, True)
    wrong = ([torch.tensor([0.0, 5.0, 6.0]), *reference[0][1:]], [2, 0])
    error, equal = compare(wrong, reference, 1e-4)
    assert not equal and error == pytest.approx(1.0)


def test_streams_is_validated():
    assert OffloadPolicy(streams="emulated").streams == "emulated"
    with pytest.raises(ValueError, match="streams must be one of"):
        OffloadPolicy(streams="fast")
    assert engine.HeadInferCache  # the public API is untouched


@pytest.mark.gpu
def test_on_cuda_every_feature_is_exact_in_fp32_and_bf16_with_lagged_streams_and_the_rates_are_measured(tmp_path):
    policy = OffloadPolicy(kv_dtype="int8", disk_dir=str(tmp_path / "disk"))
    report = selfcheck.first_use(policy, "cuda", tmp_path)
    assert report.streams == "cuda-lagged" and {case.dtype for case in report.cases} == {"float32", "bfloat16"}
    assert report.passed, [case for case in report.cases if not case.passed]
    assert report.status_line().startswith("exact on this GPU ✓ ")
    assert set(report.rates) == {"h2d_gbps", "d2h_gbps", "host_attention_gbps"}
    assert all(rate > 0 for rate in report.rates.values())
    assert selfcheck.first_use(policy, "cuda", tmp_path) == report  # stored: not run twice
