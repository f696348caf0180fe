"""The plan panel's reading time once this machine's reading cost is measured, with no click.

On a first start a plan shows "estimating… ≈ X for now" while ``engine.read_time.read_rate`` measures the reading cost in the
background (a minute or more on a busy CPU). The app's timer (``app.ui``) calls ``refreshed_plan`` each tick with
the tab's panel: while it still says "estimating…" and the session's estimate is measured now (the measurement
landed, or a read was recorded), its reading time becomes that estimate; the rest of the panel stays as it was.
A running read puts ``READING_NOW`` there instead (``with_reading_time``): one estimate on the screen, its bar's.
"""

from __future__ import annotations

import re

import gradio as gr

from app import escape, render
from app.browser_state import BrowserState

ESTIMATING = "estimating…"
READING_NOW = "reading now: the countdown is on the progress bar"  # the plan's forecast gives way to the measured one
_READING_TIME = re.compile(r"(<span>Reading time</span><b>)(.*?)(</b>)", re.S)
_SHARE = re.compile(r'data-documents-share="(\d+)"')


def refreshed_plan(state: BrowserState, panel: str | None):
    """``panel`` with the measured reading time once the session has one; ``gr.skip()`` otherwise (nothing
    provisional shown, still measuring, or a read or an answer running: its own updates own the panel then)."""
    session, tokens = state.session, state.tokens
    if not panel or ESTIMATING not in panel or session is None or tokens is None or state.is_busy:
        return gr.skip()
    if not getattr(session.read_time, "reading_cost_known", False):  # still measuring (a plain check: no probe, no plan)
        return gr.skip()
    share = _SHARE.search(panel)  # a set over the limit is estimated for what fits of it (the upload's plan)
    num_tokens = min(len(tokens), int(share.group(1))) if share else len(tokens)
    estimate = session.read_time.estimate_prefill_range(max(num_tokens, 1))
    if getattr(estimate, "provisional", False):
        return gr.skip()
    refreshed = with_reading_time(panel, render.reading_time(estimate))
    return refreshed if refreshed != panel else gr.skip()


def with_reading_time(panel: str, words: str) -> str:
    """``panel`` (``render.plan_panel``'s) with its reading time saying ``words``; the rest as it was."""
    value = escape.text(words)
    return _READING_TIME.sub(lambda match: match.group(1) + value + match.group(3), panel, count=1)
