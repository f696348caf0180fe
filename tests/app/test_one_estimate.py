"""One estimate of a read on the screen (issue 51): while the read runs, the plan panel's reading time gives way to
the progress bar's countdown (measured from the read's own chunks) instead of showing the plan's forecast beside it;
when the read ends the plan says what it took, stopped part-way what is left and its forecast, reopened from disk
how long that took. Real SmolLM2, real PDFs."""

from __future__ import annotations

import re

import pytest
from make_files import make_pdf

from app.browser_state import BrowserState
from app.estimate_refresh import READING_NOW
from app.handlers import Handlers
from engine import DocumentSession, OffloadPolicy, SnapshotStore

pytestmark = pytest.mark.slow

_TILE = re.compile(r"<span>Reading time</span><b>(.*?)</b>", re.S)


def _reading_time(panel) -> str:
    return _TILE.search(str(panel)).group(1)


@pytest.fixture
def make_handlers(embedded_model):
    model, tokenizer = embedded_model
    return lambda store=None: Handlers(lambda: DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=16)), store)


@pytest.fixture
def long_pdf(tmp_path):
    return str(make_pdf(tmp_path / "tides.pdf", [f"Chapter {n}. " + "The tide rises and falls twice a day. " * 12
                                                 for n in range(3)]))


def test_while_reading_the_plan_gives_way_to_the_bars_countdown_and_says_the_read_once_over(make_handlers,
                                                                                            long_pdf):
    handlers, state = make_handlers(), BrowserState()
    planned = handlers.choose_files([long_pdf], state).plan
    assert _reading_time(planned).startswith(("≈", "estimating…"))  # the forecast, before anything runs
    views = list(handlers.read(False, state))
    running = [view for view in views if 'data-state="running"' in str(view.progress)]
    assert any("ETA" in view.progress for view in running)  # the bar's own countdown
    panels = [view.plan for view in views if isinstance(view.plan, str)]
    assert len(panels) == 2, panels  # one as the read starts, one once it is over
    assert panels[0] is running[0].plan and _reading_time(panels[0]) == READING_NOW
    assert "≈" not in _reading_time(panels[0])
    assert 'data-state="done"' in views[-1].progress and panels[1] is views[-1].plan
    assert re.fullmatch(r"read in [\d.]+ s|read in \d+ min \d\d s", _reading_time(panels[1])), panels[1]
    assert 'data-read-seconds="' in panels[1]


def test_a_stopped_read_forecasts_the_rest(make_handlers, long_pdf):
    handlers, state = make_handlers(), BrowserState()
    handlers.choose_files([long_pdf], state)
    reading = handlers.read(False, state)
    first = next(reading)
    while 'data-state="running"' not in str(first.progress):
        first = next(reading)
    handlers.cancel(state)
    views = list(reading)
    session = state.session
    left = session.document_tokens - session.prefilled_tokens
    assert 'data-state="cancelled"' in views[-1].progress and left > 0
    tile = _reading_time(views[-1].plan)
    assert tile.endswith(f"for the {left:,} tokens left") and tile.startswith(("≈", "estimating…")), tile


def test_a_set_reopened_from_disk_says_so_in_the_plan(make_handlers, long_pdf, tmp_path):
    handlers = make_handlers(SnapshotStore(tmp_path / "kv"))
    first = BrowserState()
    handlers.choose_files([long_pdf], first)
    list(handlers.read(False, first))

    again = BrowserState()  # the same files in another tab: reopened from the saved copy by the read
    handlers.choose_files([long_pdf], again)
    views = list(handlers.read(False, again))
    assert "Reopened from disk" in str(views[-1].status)
    panels = [view.plan for view in views if isinstance(view.plan, str)]
    assert _reading_time(panels[0]) == "reopening from disk…"
    assert re.fullmatch(r"reopened from disk in [\d.]+ s", _reading_time(panels[-1])), panels[-1]
