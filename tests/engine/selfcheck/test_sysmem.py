"""VRAM that is not there (engine/selfcheck/sysmem.py): the self-check's decision on injected measurements, and
the report saying it in its status line instead of calling a crawling card normal."""

from __future__ import annotations

import pytest

from engine.selfcheck.report import SelfCheckReport
from engine.selfcheck.sysmem import SETTING, link_gbps, verdict

GEN4_X16 = link_gbps(4, 16)  # an RTX 4090's link: 31.5 GB/s each way


def test_the_link_rate_comes_from_generation_and_width():
    assert GEN4_X16 == pytest.approx(31.5, rel=1e-3)
    assert link_gbps(3, 4) == pytest.approx(3.94, rel=1e-3)
    assert link_gbps(None, 16) is None and link_gbps(4, 0) is None


def test_a_card_copying_at_its_own_speed_is_normal():
    assert verdict(device_copy_gbps=910.0, h2d_gbps=24.6, link=GEN4_X16) is None


@pytest.mark.parametrize("device_copy", [11.0, 30.0, 60.0])
def test_a_device_copy_no_faster_than_the_link_names_the_sysmem_fallback_setting(device_copy):
    words = verdict(device_copy_gbps=device_copy, h2d_gbps=24.0, link=GEN4_X16)
    assert "spilling into shared system memory" in words and SETTING in words


def test_under_wsl2_the_setting_is_not_offered_as_the_cure():
    words = verdict(device_copy_gbps=11.0, h2d_gbps=24.0, link=GEN4_X16, wsl=True)
    assert "WSL2 ignores" in words and SETTING not in words


def test_a_link_under_a_quarter_of_its_rate_is_named_apart():
    words = verdict(device_copy_gbps=910.0, h2d_gbps=6.0, link=GEN4_X16)
    assert "under a quarter of the PCIe link" in words and "spilling" not in words
    assert verdict(device_copy_gbps=910.0, h2d_gbps=9.0, link=GEN4_X16) is None  # slow, not that slow


def test_without_the_link_nothing_is_judged():
    assert verdict(device_copy_gbps=11.0, h2d_gbps=1.0, link=None) is None


def _report(rates: dict) -> SelfCheckReport:
    return SelfCheckReport({"gpu": "RTX 4090"}, "2026-12-02", "cuda:0", "cuda-lagged", [], rates, 1.0)


def test_the_report_says_a_spilling_card_is_slow_and_keeps_it_across_a_reload():
    spilled = _report({"h2d_gbps": 24.0, "d2h_gbps": 25.0, "device_copy_gbps": 12.0, "link_gbps": GEN4_X16})
    line = spilled.status_line()
    assert line.startswith("exact on this GPU ✓") and "slow:" in line and "Sysmem Fallback" in line
    assert SelfCheckReport.from_json(spilled.to_json()).status_line() == line
    healthy = _report({"h2d_gbps": 24.0, "d2h_gbps": 25.0, "device_copy_gbps": 900.0, "link_gbps": GEN4_X16})
    assert "slow:" not in healthy.status_line() and healthy.memory_warning is None
    assert _report({"h2d_gbps": 24.0}).memory_warning is None  # a report from before the device copy was timed
