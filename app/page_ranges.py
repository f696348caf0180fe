"""Choosing what of a document set too large to read whole is read: a page range from–to, with its token count
and whether it fits, live, and "First part that fits" (a handler piece of ``app.handlers.Handlers``; it needs
nothing the tabs share, only the tab's own ``BrowserState``)."""

from __future__ import annotations

import gradio as gr

from app import render
from app.browser_state import BrowserState
from app.pieces import choices, describe, first_part_that_fits, parts_read, pieces_of, range_text, range_tokens
from app.pages import tokenize
from app.read_offer import read_button
from app.render import status
from app.views import FirstPartView, RangeOffer, RangeView
from engine import DocumentSession, PlanError
from engine.types import Plan

NO_CHANGE: dict = gr.update()


class PageRanges:
    """Page ranges of the tab's chosen documents."""

    @staticmethod
    def pages_to_choose(state: BrowserState) -> list:
        """The chosen set's pages, to choose a range from (it does not fit whole)."""
        return pieces_of(state.documents)

    @staticmethod
    def range_offer(state: BrowserState) -> RangeOffer:
        """The page range picker: shown, with the set's pages, when the set does not fit whole; else hidden."""
        session = state.session
        if not state.pieces or session is None:
            return RangeOffer(gr.update(visible=False), gr.update(choices=[], value=None),
                              gr.update(choices=[], value=None), "")
        options = choices(state.pieces)
        info = render.range_info(None, None, _document_limit(session, session.limits()))
        return RangeOffer(gr.update(visible=True), gr.update(choices=options, value=None),
                          gr.update(choices=options, value=None), info)

    def choose_range(self, first: int | None, last: int | None, state: BrowserState) -> RangeView:
        """The chosen pages: their token count and whether they fit, live; when they do, they are what
        “Read documents” reads."""
        session = state.session
        whole = state.full_tokens
        if session is None or whole is None or not state.pieces or first is None or last is None:
            state.tokens, state.range_label = whole, None
            return RangeView(state, NO_CHANGE, NO_CHANGE, NO_CHANGE, NO_CHANGE, NO_CHANGE, NO_CHANGE)
        first, last = sorted((int(first), int(last)))
        last = min(last, len(state.pieces) - 1)
        label = describe(state.pieces, first, last)
        limit = _document_limit(session, session.limits())
        estimate = range_tokens(whole, state.pieces, first, last)
        if estimate is not None and estimate > 1.05 * limit:  # clearly too long: not worth tokenizing
            state.tokens, state.range_label = whole, None
            return RangeView(state, _table(state), render.range_info(label, estimate, limit), NO_CHANGE, NO_CHANGE,
                             NO_CHANGE,
                             status("warn", f"{label} takes about {estimate:,} tokens; at most {limit:,} fit."))
        tokens = tokenize(session, range_text(whole.text, state.pieces, first, last))
        if len(tokens) > limit:
            state.tokens, state.range_label = whole, None
            return RangeView(state, _table(state), render.range_info(label, len(tokens), limit), NO_CHANGE, NO_CHANGE,
                             NO_CHANGE, status("warn", f"{label} takes {len(tokens):,} tokens; at most {limit:,} fit."))
        state.tokens, state.range_label = tokens, label
        try:
            plan = session.plan(tokens)
        except PlanError as exc:
            return RangeView(state, _table(state), render.range_info(label, len(tokens), limit), NO_CHANGE,
                             NO_CHANGE, NO_CHANGE, status("error", str(exc)))
        seconds = session.read_time.estimate_prefill_range(len(tokens))
        panel = render.plan_panel(plan, len(tokens), seconds, session.policy.kv_dtype,
                                 conversation_tokens=session.answer_budget,
                             weights=getattr(session, "weights", None))
        return RangeView(state, _table(state), render.range_info(label, len(tokens), limit), panel,
                         gr.update(value=False),
                         read_button(state, False),
                         status("ok", f"Ready to read {label} ({len(tokens):,} tokens). Press “Read documents”."))

    def first_part(self, state: BrowserState) -> FirstPartView:
        """Sets the range to the most pages from the first that fit."""
        session, whole = state.session, state.full_tokens
        if session is None or whole is None or not state.pieces:
            return FirstPartView(NO_CHANGE, NO_CHANGE, status("warn", "Drop a document set first."))
        last = first_part_that_fits(whole, state.pieces, _document_limit(session, session.limits()))
        if last is None:
            return FirstPartView(NO_CHANGE, NO_CHANGE, status("warn", "Not even the first page fits; tick "
                                                                      "“Truncate to fit” to read its beginning."))
        return FirstPartView(gr.update(value=0), gr.update(value=last), NO_CHANGE)


def _table(state: BrowserState) -> str:
    """The files table of what "Read documents" reads: the chosen range's pages, characters and tokens (the counts
    the plan and the status say beside it), else the whole set's."""
    tokens = state.tokens
    if state.range_label is None or tokens is None:
        return render.files_table(state.documents, state.token_counts, len(state.full_tokens))
    parts = parts_read(tokens.text, state.documents)
    counts = [tokens.count_between(start, end) for _, start, end in parts]
    counts = [state.session.count_tokens(doc.text) if count is None else count
              for (doc, _, _), count in zip(parts, counts, strict=True)]
    return render.files_table([doc for doc, _, _ in parts], counts, len(tokens), state.range_label)


def _document_limit(session: DocumentSession, plan: Plan) -> int:
    """Tokens a document (with its prompt) may take: the context limit less the room kept for answers."""
    return max(session.document_limit(plan), 1)
