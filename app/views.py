"""What each handler returns: named tuples whose fields match the outputs wired in ``app/ui.py``, so tests
read ``view.plan`` instead of ``out[2]``."""

from __future__ import annotations

from typing import Any, NamedTuple

import gradio as gr

from app.browser_state import BrowserState


class FilesView(NamedTuple):
    state: BrowserState
    table: str
    plan: str
    truncate: dict
    read_button: dict
    status: Any


class RangeOffer(NamedTuple):
    """The page range, offered when the chosen set is too large to read whole (hidden otherwise)."""

    range_box: Any
    range_from: Any
    range_to: Any
    range_info: Any


class RangeView(NamedTuple):
    state: BrowserState
    table: Any
    range_info: str
    plan: Any
    truncate: Any
    read_button: Any
    status: Any


class ReadView(NamedTuple):
    state: BrowserState
    progress: str
    status: Any
    chat: Any
    read_button: dict
    cancel_button: dict
    plan: Any = gr.update()  # the plan of what is read when the set was truncated to fit; else unchanged
    pages: Any = gr.update()  # the page chips: emptied when a new document is read
    page: Any = gr.update()  # the page viewer: emptied with them


class AskView(NamedTuple):
    chat: list[dict]
    question: Any
    status: Any
    pages: Any = None  # the page chips: pages the answer cites or attended to (gr.update), or NO_CHANGE


class SavedView(NamedTuple):
    panel: str
    choice: dict


class DeleteView(NamedTuple):
    panel: str
    choice: dict
    status: Any


class ClearView(NamedTuple):
    state: BrowserState
    files: None
    table: str
    plan: str
    truncate: dict
    progress: str
    chat: list
    status: str
    pages: Any = gr.update()  # the page chips: they go with the documents
    page: Any = gr.update()  # the page viewer: emptied with them


class FirstPartView(NamedTuple):
    range_from: Any
    range_to: Any
    status: Any


class OpenView(NamedTuple):
    state: BrowserState
    table: str
    plan: str
    progress: str
    chat: Any
    status: Any
    read_button: dict
    cancel_button: dict
    pages: Any = gr.update()  # the page chips: emptied when another document is opened
    page: Any = gr.update()  # the page viewer: emptied with them
