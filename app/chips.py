"""The page chips: a radio of the pages an answer cites or attended to, whose choices each finished answer
replaces."""

from __future__ import annotations

import logging

import gradio as gr

logger = logging.getLogger(__name__)


class PageChips(gr.Radio):
    """A ``gr.Radio`` (the same widget in the browser) whose stale value means no page chosen.

    The choices change under the browser: each answer replaces them, a new document empties them. A value the
    browser sends from before (a page of the last answer, or ``[]``, which a hidden radio emptied of its choices
    sent once on a loaded machine) is not among the choices; the stock radio refuses it with an error toast and a
    traceback. Here it is simply no page: the viewer shows none.
    """

    is_template = True  # the browser's widget: the parent's (``radio``)

    def preprocess(self, payload):
        choices = [value for _, value in self.choices]
        if payload is not None and payload not in choices:  # ``[]`` included: a list is never a choice
            logger.debug("page chip %r is not among the chips %s: no page chosen", payload, choices)
            return None
        return super().preprocess(payload)
