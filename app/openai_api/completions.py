"""One completion: checked against the context before any work (a 400 at once), then a place in the compute device's
line (the page's own ``ComputeQueue``, where the page's visitors see it), then the answer from the matched
document's K/V (``app.openai_api.library``), reported piece by piece to the route from a worker thread.

``check`` runs before the line and ``run`` in the worker thread; ``run`` matches again once it is at the front (a tab
may have closed or read another document meanwhile) and checks the fit again there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.app_state import AppState
from app.openai_api.library import Library, Match, render
from app.openai_api.schema import ApiError, Request, usage
from app.openai_api.stops import StopWatch
from app.questions import CHARS_PER_TOKEN, LONGEST_ANSWER
from engine import HeadInferError
from engine.types import DocumentTokens

logger = logging.getLogger(__name__)

QUEUE_WHAT = "answering an API request"  # what the page's visitors waiting behind it are told


@dataclass(frozen=True)
class Checked:
    """A request that fits: its prompt, the document it begins with and the answer's token limit."""

    request: Request
    match: Match
    prompt_tokens: int
    max_tokens: int


class Completions:
    def __init__(self, app: AppState, library: Library):
        self.app, self.library = app, library

    def ids(self, text: str) -> list[int]:
        return self.library.tokenizer()(text, add_special_tokens=False)["input_ids"]

    def check(self, request: Request) -> Checked:
        """The request's prompt matched and measured; ``ApiError`` 400 when it cannot fit (the numbers and why)."""
        prompt = request.prompt if request.prompt is not None else render(self.library.tokenizer(), request.messages)
        match = self.library.match(prompt)
        own = self.library.own_session()
        if match.held is not None:
            document = match.held.tokens()
            allowance = document + (match.held.session or own).answer_budget
            _within_characters(match.rest, allowance - document, request)
            prompt_tokens = document + len(self.ids(match.rest))
            where = (f"the {allowance:,} tokens this document's context is planned for (its {document:,} tokens and "
                     f"the conversation allowance beside them)")
        else:
            _within_characters(prompt, own.limits().context_limit, request)
            ids = self.ids(prompt)
            prompt_tokens = len(ids)
            try:
                plan = own.plan(DocumentTokens(prompt, ids))
            except HeadInferError as exc:
                raise ApiError(400, f"Not answered: {exc}.", code="invalid_prompt") from None
            allowance = min(plan.context_limit, prompt_tokens + own.answer_budget)
            where = f"the {allowance:,} tokens a prompt's context may take here ({plan.limit_reason})"
        room = allowance - prompt_tokens
        max_tokens = request.max_tokens if request.max_tokens is not None else min(room, LONGEST_ANSWER)
        if room < 1 or max_tokens > room:
            raise ApiError(400, f"The prompt takes {prompt_tokens:,} tokens; with max_tokens {max_tokens:,} that is "
                                f"{prompt_tokens + max_tokens:,}, past {where}. Shorten the prompt or lower max_tokens"
                                f" (at most {max(room, 0):,} here).", code="context_length_exceeded",
                           param="messages" if request.prompt is None else "prompt")
        return Checked(request, match, prompt_tokens, max_tokens)

    def run(self, checked: Checked, report: Callable[[tuple], None], gone: Callable[[], bool]) -> None:
        """Waits for the front of the line and answers, reporting ``("text", new text)`` pieces and a last ``("end",
        finish_reason, usage, extras)``; nothing more once ``gone()`` (the client left: out of the line, the answer
        stopped)."""
        own = self.library.own_session()
        expected = (own.read_time.estimate_prefill_seconds(checked.prompt_tokens, 0)
                    + self.app.answers.expected_seconds(checked.max_tokens))
        queue = self.app.queue
        ticket = queue.join(QUEUE_WHAT, expected)
        try:
            waiting = queue.wait_front(ticket, gone)
            while True:
                try:
                    next(waiting)
                except StopIteration as done:
                    if not done.value:
                        logger.info("an API client left the line before it reached the front")
                        return
                    break
            match = self.library.match(checked.match.prompt)  # again, at the front of the line: the tabs may have changed
            state = match.held.state if match.held is not None else None
            if state is None:
                self._answer(checked, match, report, gone)
                return
            with state.working():  # the tab's Clear and New chat wait while its K/V answers the API
                self._answer(checked, match, report, gone)
        finally:
            queue.leave(ticket)

    def _answer(self, checked: Checked, match: Match, report, gone) -> None:
        request, started = checked.request, time.monotonic()
        try:
            session, continuation, read = self.library.take(match, self.ids, gone)
        except HeadInferError as exc:
            raise ApiError(400, f"Not answered: {exc}.", code="invalid_prompt") from None
        prompt_tokens = session.document_tokens + len(continuation)
        if prompt_tokens + checked.max_tokens > session.max_context:
            raise ApiError(400, f"The prompt takes {prompt_tokens:,} tokens; with max_tokens {checked.max_tokens:,} "
                                f"that is past the {session.max_context:,} this document's context holds.",
                           code="context_length_exceeded")
        reused = max(session.reused_tokens(continuation) - read, 0)
        watch = StopWatch(request.stop)
        chunk = None
        for chunk in session.complete(continuation, question=request.question, max_new_tokens=checked.max_tokens,
                                      temperature=request.temperature, top_p=request.top_p,
                                      seed=request.seed or 0, should_stop=lambda: gone() or watch.hit):
            if gone():
                return
            new = watch.finish(chunk.text) if chunk.done else watch.push(chunk.text)
            if new:
                report(("text", new))
        if chunk is None or (chunk.stopped and not watch.hit):
            return
        finish = "stop" if watch.hit or chunk.num_tokens < checked.max_tokens or chunk.looped else "length"
        support = chunk.support if finish == "stop" and not watch.hit else None
        extra = {"reused_tokens": reused, "computed_prompt_tokens": prompt_tokens - reused,
                 "document": None if match.held is None else {"kind": match.held.kind, "label": match.held.label},
                 "sources": [{"page": source.page, "share": round(source.share, 4)} for source in chunk.sources],
                 "may_not_say": None if support is None else not support.is_supported,
                 "seconds": round(time.monotonic() - started, 3)}
        report(("end", finish, usage(prompt_tokens, chunk.num_tokens), extra))


def _within_characters(text: str, room: int, request: Request) -> None:
    """A 400 for ``text`` far past ``room`` tokens, before it is tokenized (tokenizing 30 MB took two minutes of CPU):
    4x the characters a token rarely passes, so a text near its room still gets the exact token numbers."""
    limit = 4 * CHARS_PER_TOKEN * max(room, LONGEST_ANSWER)
    if len(text) > limit:
        raise ApiError(400, f"The prompt has {len(text):,} characters and this context takes at most {limit:,} here "
                            f"(room for {room:,} tokens); shorten the prompt.", code="context_length_exceeded",
                       param="messages" if request.prompt is None else "prompt")
