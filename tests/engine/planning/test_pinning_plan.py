"""The plan within the pin budget (engine/planning/pinning.py): what is pinned, what goes through the staging ring and
what that is predicted to cost, and the start-up limit (the variable, or the probe where pins are capped)."""

from __future__ import annotations

import dataclasses

import pytest
from archs import llama3_8b_config

from engine.kv import pin_budget
from engine.planning.pinning import with_pinning
from engine.planning.planner import make_plan
from engine.planning.policy import OffloadPolicy
from engine.planning.shape import ModelShape

GIB = 1 << 30


def llama() -> ModelShape:
    return ModelShape.from_config(llama3_8b_config(), dtype_bytes=2, num_params=8_030_000_000)


def _plan_128k(monkeypatch, limit: str | None):
    if limit is None:
        monkeypatch.delenv(pin_budget.ENV_LIMIT, raising=False)
    else:
        monkeypatch.setenv(pin_budget.ENV_LIMIT, limit)
    # A 24 GiB card's what-if plan: most of a 128K read's 16 GiB of KV offloaded to RAM.
    return make_plan(llama(), OffloadPolicy(), 128 * 1024, device_is_cuda=True, gpu_budget=22 * GIB,
                     host_budget=120 * GIB)


def test_without_a_limit_every_ram_home_is_pinned(monkeypatch):
    plan = _plan_128k(monkeypatch, None)
    assert plan.pin_limit is None and plan.staged_bytes == 0
    assert 10 * GIB < plan.pinned_bytes <= plan.host_bytes  # the offloaded homes, in pinned RAM
    assert "through the staging ring" not in plan.pinning_line()


def test_past_a_4_gib_limit_the_rest_is_staged_and_the_plan_says_so(monkeypatch):
    unlimited = _plan_128k(monkeypatch, None)
    plan = _plan_128k(monkeypatch, "4GiB")
    assert plan.pin_limit == 4 * GIB and plan.pinned_bytes <= 4 * GIB
    # Every RAM home is either pinned or staged (the ring's buffers are the part of the pinned bytes beyond homes).
    ring = min(4 * 64 << 20, GIB)
    assert plan.pinned_bytes - ring + plan.staged_bytes == unlimited.pinned_bytes
    assert "GiB of KV in ordinary memory, through the staging ring" in plan.pinning_line()
    assert plan.pinning_line() in plan.summary()


def test_the_staging_cost_is_the_memcpy_slower_than_the_link(monkeypatch):
    plan = dataclasses.replace(_plan_128k(monkeypatch, "4GiB"), h2d_gbps=25.0, host_share=0.0)
    slow = with_pinning(plan, memcpy_gbps=10.0)
    fast = with_pinning(plan, memcpy_gbps=50.0)
    staged = slow.staged_bytes
    assert slow.staging_seconds == pytest.approx(staged / 10e9 - staged / 25e9)
    assert fast.staging_seconds == 0.0  # a memcpy faster than the link hides behind the h2d copies
    assert "ms/token predicted" in slow.pinning_line()


def test_a_cpu_plan_pins_nothing(monkeypatch):
    monkeypatch.setenv(pin_budget.ENV_LIMIT, "64MiB")
    plan = make_plan(llama(), OffloadPolicy(), 8192, device_is_cuda=False, host_budget=120 * GIB)
    assert (plan.pin_limit, plan.pinned_bytes, plan.staged_bytes) == (None, 0, 0)


@pytest.fixture
def fresh_process_budget(monkeypatch):
    monkeypatch.delenv(pin_budget.ENV_LIMIT, raising=False)
    pin_budget.process_budget.cache_clear()
    yield
    pin_budget.process_budget.cache_clear()


def test_where_pins_are_capped_the_limit_is_probed_once(fresh_process_budget):
    asked = []

    def probe(want):
        asked.append(want)
        return GIB

    assert pin_budget.settle_limit(100 * GIB, probe=probe, capped=True) == GIB
    assert asked == [pin_budget.PROBE_CAP]  # tried up to the cap, not the whole host budget
    assert pin_budget.settle_limit(100 * GIB, probe=probe, capped=True) == GIB and len(asked) == 1
    assert pin_budget.process_budget().limit == GIB


def test_elsewhere_nothing_is_probed_and_nothing_capped(fresh_process_budget):
    assert pin_budget.settle_limit(100 * GIB, probe=lambda want: pytest.fail("probed"), capped=False) is None


def test_the_variable_wins_over_the_probe(fresh_process_budget, monkeypatch):
    monkeypatch.setenv(pin_budget.ENV_LIMIT, "4GiB")
    pin_budget.process_budget.cache_clear()
    assert pin_budget.settle_limit(100 * GIB, probe=lambda want: pytest.fail("probed"), capped=True) == 4 * GIB
