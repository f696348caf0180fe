"""One plan, made once, passed down (issue 17 item 1): the machine is read once per session, the session's plan is
the one the cache allocates, and the cache's constructor reads the config and nothing else."""

from __future__ import annotations

import dataclasses

import psutil
import pytest
import torch
from tiny_sessions import tiny_model, word_tokenizer, words_text
from transformers import AutoModelForCausalLM, LlamaConfig

from engine import HeadInferCache, OffloadPolicy
from engine.errors import PlanError
from engine.planning import budgets, machine_rates
from engine.planning import machine as telemetry
from engine.planning.budgets import MachineBudget, card_budget, measure_budget
from engine.planning.planner import make_plan
from engine.planning.shape import ModelShape
from engine.read_time import flops
from engine.session import DocumentSession

GIB = 1 << 30
CONFIG = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=97, max_position_embeddings=256)


class StandInCuda:
    """torch.cuda's memory calls, scripted: 10 GiB free of 24, 6 GiB held by this process (the weights)."""

    def __init__(self):
        self.calls = []

    def mem_get_info(self, device=None):
        self.calls.append("mem_get_info")
        return 10 * GIB, 24 * GIB

    def memory_reserved(self, device=None):
        self.calls.append("memory_reserved")
        return 6 * GIB

    def synchronize(self, device=None):
        pass

    def memory_allocated(self, device=None):
        return 1000

    def reset_peak_memory_stats(self, device=None):
        pass

    def max_memory_allocated(self, device=None):
        return 1000 + (300 << 20)


def test_cpu_budget_is_a_share_of_available_ram_and_no_gpu():
    budget = measure_budget("cpu", OffloadPolicy())
    assert budget.device_is_cuda is False and budget.gpu_budget is None and budget.rates is None
    assert 0 < budget.host_budget <= psutil.virtual_memory().total


def test_gpu_budget_is_free_plus_what_we_hold_less_the_reserve_and_the_dry_run_peak_is_kept():
    model = AutoModelForCausalLM.from_config(CONFIG, attn_implementation="headinfer").eval()
    cuda = StandInCuda()
    policy = OffloadPolicy(host_attention="off", chunk_size=16, gpu_reserve=2 * GIB)
    budget = measure_budget("cuda", policy, model=model, vocab_size=97, cuda=cuda)
    assert budget.device_is_cuda and budget.gpu_budget == 10 * GIB + 6 * GIB - 2 * GIB
    assert budget.activation_bytes == 300 << 20 and budget.rates is None  # host attention off: no split to plan
    default = measure_budget("cuda", dataclasses.replace(policy, gpu_reserve=OffloadPolicy().gpu_reserve), cuda=cuda)
    assert default.gpu_budget == 16 * GIB - int(1.5 * GIB)  # the default reserve: 1.5 GiB


def test_a_device_that_cannot_be_read_is_a_clear_error():
    with pytest.raises(ValueError, match="unsupported device"):
        measure_budget("meta", OffloadPolicy())
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            measure_budget("cuda:0", OffloadPolicy())
    with pytest.raises(ValueError, match="gpu_reserve"):
        OffloadPolicy(gpu_reserve=-1)


def test_a_cards_budget_leaves_the_context_and_the_reserve():
    assert card_budget(24 * GIB) == 24 * GIB - budgets.CUDA_CONTEXT_BYTES - int(1.5 * GIB)
    assert card_budget(GIB) == 0
    assert budgets.CUDA_CONTEXT_BYTES >= 784_000_000  # the context the H200 run measured (torch 2.11, CUDA 13.0)
    assert card_budget(24 * GIB, context_bytes=784_000_000) == 24 * GIB - 784_000_000 - int(1.5 * GIB)


def test_a_machine_plans_as_its_parts_and_the_gpu_override_applies_once():
    shape = ModelShape.from_config(CONFIG, dtype_bytes=2)
    machine = MachineBudget(True, 20 * GIB, 64 * GIB, None, 300 << 20)
    policy = OffloadPolicy(chunk_size=64)
    parts = make_plan(shape, policy, 200, device_is_cuda=True, gpu_budget=20 * GIB, host_budget=64 * GIB,
                      activation_bytes=300 << 20)
    assert make_plan(shape, policy, 200, machine=machine) == parts
    override = dataclasses.replace(policy, gpu_memory=GIB, host_memory=2 * GIB)
    assert make_plan(shape, override, 200, device_is_cuda=True, gpu_budget=20 * GIB).gpu_budget == GIB  # what-if
    measured = measure_budget("cuda", dataclasses.replace(override, host_attention="off"), cuda=StandInCuda())
    assert (measured.gpu_budget, measured.host_budget) == (GIB, 2 * GIB)  # a measured machine carries them
    less = dataclasses.replace(measured, gpu_budget=GIB // 2)  # e.g. what other tabs leave
    assert make_plan(shape, override, 200, machine=less).gpu_budget == GIB // 2  # not overridden a second time
    with pytest.raises(PlanError, match="machine"):
        make_plan(shape, policy, 200)


def test_the_constructor_reads_the_config_and_nothing_else(monkeypatch):
    def probed(*args, **kwargs):
        raise AssertionError("the cache's constructor probed the machine")

    for module, name in ((psutil, "virtual_memory"), (machine_rates, "machine_rates"), (machine_rates, "plan_rates"),
                         (flops, "measured_flop_rate"), (telemetry, "measure_activation_peak"),
                         (budgets, "measure_budget"), (torch.cuda, "mem_get_info")):
        monkeypatch.setattr(module, name, probed)
    config = CONFIG
    cache = HeadInferCache(config, device="cpu", chunk_size=32, max_context=128)
    assert cache.plan.host_budget is None and cache.plan.fits  # no budget but the policy's
    given = make_plan(cache.shape, OffloadPolicy(chunk_size=32), 128, device_is_cuda=False, host_budget=GIB)
    monkeypatch.setattr("engine.cache.make_plan", probed)  # given a plan, it plans nothing
    planned = HeadInferCache(config, device="cpu", chunk_size=32, max_context=128, plan=given)
    assert planned.plan is given


def test_a_plan_made_for_another_chunk_or_device_is_refused():
    shape = ModelShape.from_config(CONFIG, dtype_bytes=4)
    other = make_plan(shape, OffloadPolicy(chunk_size=64), 128, device_is_cuda=False)
    with pytest.raises(ValueError, match="another policy or device"):
        HeadInferCache(CONFIG, device="cpu", chunk_size=32, plan=other)
    cuda_plan = make_plan(shape, OffloadPolicy(chunk_size=32), 128, device_is_cuda=True)
    with pytest.raises(ValueError, match="another policy or device"):
        HeadInferCache(CONFIG, device="cpu", chunk_size=32, plan=cuda_plan)


def test_a_session_reads_the_machine_once_and_its_cache_allocates_its_plan(tmp_path, monkeypatch):
    readings = []
    measure = budgets.measure_budget

    def counted(*args, **kwargs):
        readings.append(args)
        return measure(*args, **kwargs)

    monkeypatch.setattr("engine.session.measure_budget", counted)
    model, tokenizer = tiny_model(tmp_path), word_tokenizer()
    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=64), answer_budget=32)
    session.limits()
    session.capacity_options()
    first = words_text(1)
    expected = session.plan(first)
    session.set_document(first)
    assert session.cache.plan == expected  # the plan shown is the plan that allocates
    session.set_document(words_text(2))
    session.prefill()
    assert len(readings) == 1


def test_tabs_serving_one_model_read_the_machine_once_and_plan_within_what_the_others_hold(tmp_path, monkeypatch):
    readings = []

    def measured(device, policy, **kwargs):
        readings.append(device)
        return MachineBudget(False, None, 2 * GIB)

    monkeypatch.setattr("engine.session.measure_budget", measured)
    model, tokenizer = tiny_model(tmp_path), word_tokenizer()
    first = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=64), answer_budget=32)
    second = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=64), answer_budget=32)
    alone = second.plan(words_text(2)).max_context_tokens
    first.set_document(words_text(1))
    claimed = first.cache.plan.host_bytes - first.shape.weights_bytes
    assert second.machine.host_budget == 2 * GIB - claimed  # what the first tab's document holds is not offered
    assert first.machine.host_budget == 2 * GIB  # a session's own document is not held against itself
    assert second.plan(words_text(2)).max_context_tokens < alone
    first.clear()
    assert second.machine.host_budget == 2 * GIB and second.plan(words_text(2)).max_context_tokens == alone
    assert len(readings) == 1  # one reading per loaded model, whatever the number of tabs


def test_a_tab_refused_for_memory_others_hold_is_told_so(tmp_path, monkeypatch):
    model, tokenizer = tiny_model(tmp_path), word_tokenizer()
    first = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=64), answer_budget=32)
    second = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=64), answer_budget=32)
    weights = first.shape.weights_bytes
    tokens = len(first.tokenize(words_text(1)))
    need = make_plan(first.shape, first.policy, tokens + 32, device_is_cuda=False).host_bytes  # nothing read yet
    monkeypatch.setattr("engine.session.measure_budget",
                        lambda *a, **k: MachineBudget(False, None, need + (need - weights) // 2))
    first.set_document(words_text(1))
    with pytest.raises(PlanError, match="other tabs' documents hold"):
        second.set_document(words_text(3))
    first.clear()
    assert second.set_document(words_text(3)) > 100  # room again once the first tab let go
