"""Whether “Read documents” would read something new: the one rule behind the button's state. Each handler that
changes what it reads (files, a page range, “Truncate to fit”, a read's end, clearing, reopening) answers with
it, and the page asks it again after each of those events (``app.ui``)."""

from __future__ import annotations

import gradio as gr

from app.browser_state import BrowserState
from engine import PlanError


def can_read(state: BrowserState, truncate: bool) -> bool:
    """True when pressing “Read documents” now reads something: a set (or page range) not read yet that fits, or
    fits once truncated with ``truncate`` on, or the rest of a read stopped or failed part-way (it goes on)."""
    session, tokens = state.session, state.tokens
    if not state.documents:
        return False
    if session is None or tokens is None:  # a model switch let the old tokens go: the read tokenizes them again
        return True
    if tokens.text == state.read_text and session.document_tokens:
        return not session.is_prefilled
    try:
        plan = session.plan(tokens)
    except PlanError:
        return False
    limit = session.document_limit(plan)  # ``DocumentSession.set_document``'s own test
    return len(tokens) <= limit or (bool(truncate) and limit >= 1)


def read_button(state: BrowserState, truncate: bool) -> dict:
    """The button's update by ``can_read``."""
    return gr.update(interactive=can_read(state, truncate))
