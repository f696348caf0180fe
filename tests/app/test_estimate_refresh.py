"""The plan panel's "estimating…" reading time becomes the measured estimate when the background measurement lands,
on the app's timer, with no click (``app.estimate_refresh``); nothing else in the panel changes."""

from __future__ import annotations

from transformers import LlamaConfig

from app import render
from app.browser_state import BrowserState
from app.estimate_refresh import refreshed_plan
from engine.planning.planner import make_plan
from engine.planning.shape import ModelShape
from engine.planning.policy import OffloadPolicy
from engine.read_time.read_rate import ReadEstimate

MEASURED = ReadEstimate(20.0, 30.0, 45.0)
PROVISIONAL = ReadEstimate(10.0, 30.0, 90.0, provisional=True)


class MeasuringEstimates:
    """What the refresh asks of a session's ``reading``: whether the cost is measured yet, and the estimate (calls
    recorded)."""

    def __init__(self):
        self.reading_cost_known, self.asked = False, []

    def estimate_prefill_range(self, num_tokens, start=0):
        self.asked.append(num_tokens)
        return MEASURED if self.reading_cost_known else PROVISIONAL


class MeasuringSession:
    """A session whose read estimates are ``MeasuringEstimates``."""

    def __init__(self):
        self.read_time = MeasuringEstimates()


def plan_panel(estimate, document_tokens: int) -> str:
    shape = ModelShape.from_config(LlamaConfig(num_hidden_layers=2, num_key_value_heads=2, head_dim=16,
                                               num_attention_heads=4, hidden_size=64,
                                               max_position_embeddings=8192), dtype_bytes=4)
    plan = make_plan(shape, OffloadPolicy(), document_tokens + 2048, device_is_cuda=False, host_budget=1 << 34)
    return render.plan_panel(plan, document_tokens, estimate, conversation_tokens=2048)


def test_the_estimating_reading_time_is_replaced_once_measured_and_nothing_else():
    session, state = MeasuringSession(), BrowserState()
    state.session, state.tokens = session, list(range(1500))
    shown = plan_panel(PROVISIONAL, 1500)
    assert "estimating…" in shown
    assert not isinstance(refreshed_plan(state, shown), str)  # still measuring: left alone
    assert session.read_time.asked == []  # (asked only once measured: no probe, no measurement started by a tick)
    session.read_time.reading_cost_known = True  # the measurement landed
    refreshed = refreshed_plan(state, shown)
    assert refreshed == plan_panel(MEASURED, 1500) and "estimating…" not in refreshed
    assert session.read_time.asked == [1500]
    # A measured panel, a read or an answer running, or no document: left alone.
    assert not isinstance(refreshed_plan(state, refreshed), str)
    state.is_busy = True
    assert not isinstance(refreshed_plan(state, shown), str)
    state.is_busy, state.tokens = False, None
    assert not isinstance(refreshed_plan(state, shown), str)


def test_a_set_over_the_limit_is_estimated_for_what_fits_as_the_upload_estimated_it():
    session, state = MeasuringSession(), BrowserState()
    shown = plan_panel(PROVISIONAL, 9000)
    share = int(shown.split('data-documents-share="')[1].split('"')[0])  # what “Truncate to fit” reads of it
    state.session, state.tokens, session.read_time.reading_cost_known = session, list(range(9000)), True
    assert isinstance(refreshed_plan(state, shown), str) and session.read_time.asked == [share] == [6144]
