"""The self-check's MoE case: fused experts, in nf4 when the served weights are (``bnb-nf4``), quantized by the
loader's own quantizer (``engine.models.quantized_experts``), head-wise against stock over the same weights."""

from __future__ import annotations

import pytest
import torch

from engine import OffloadPolicy
from engine.models import quantized_experts
from engine.models.quantized import SCHEMES
from engine.selfcheck import report as selfcheck
from engine.selfcheck.cases import MOE, TinyPair

pytest.importorskip("bitsandbytes")


def _experts(model):
    return [module for module in model.modules() if quantized_experts.experts_weight_names(module)]


def test_the_moe_pair_holds_its_experts_in_nf4_as_the_loader_does_and_runs_them_so():
    pair = TinyPair.build(MOE, torch.float32, torch.device("cpu"), SCHEMES["bnb-nf4"])
    for model in (pair.stock, pair.headinfer):
        experts = _experts(model)
        assert len(experts) == model.config.num_hidden_layers
        assert all(type(e.gate_up_proj).__name__ == type(e.down_proj).__name__ == "Params4bit" for e in experts)
        assert model.config._experts_implementation == quantized_experts.METHOD
    assert torch.equal(_experts(pair.stock)[0].down_proj, _experts(pair.headinfer)[0].down_proj)


def test_a_self_check_of_nf4_weights_checks_the_nf4_experts_and_passes(tmp_path):
    report = selfcheck.run_self_check(OffloadPolicy(), "cpu", folder=tmp_path, archs=(MOE,), weights="bnb-nf4")
    assert [(case.feature, case.arch) for case in report.cases] == [("overlap", MOE)]
    assert report.passed and report.cases[0].tokens_equal, report.cases


def test_the_moe_case_fails_when_the_head_wise_models_experts_are_wrong(monkeypatch, tmp_path):
    """The case compares what the experts compute: one expert's nf4 codes changed in the head-wise model alone
    (after both loaded the same weights) fails it."""
    build = TinyPair.build

    def broken(*args, **kwargs):
        pair = build(*args, **kwargs)
        for experts in _experts(pair.headinfer):
            codes = experts.down_proj.data.view(-1)  # two 4-bit codes a byte, expert after expert
            first = codes[: codes.numel() // experts.num_experts]
            first.copy_(first ^ 0x11)  # every code of expert 0 moved by one level
        return pair

    monkeypatch.setattr(TinyPair, "build", broken)
    report = selfcheck.run_self_check(OffloadPolicy(), "cpu", folder=tmp_path, archs=(MOE,), weights="bnb-nf4")
    assert not report.passed and not report.cases[0].passed
