"""One answer: decoding it token by token (a streamed chunk per token), and what its sources need.

``DocumentSession.ask`` builds the prompt, brings the cache to it and records the answer's sources; the loop
here only turns logits into tokens and text, feeding each token back through ``forward``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass

import torch

from ..errors import ForwardInterrupted
from ..paths import cache_dir
from ..reports import AnswerChunk, answer_rate
from .retrieval_heads import find_retrieval_heads
from .sampling import IncrementalDecoder, RepetitionGuard, next_token, stop_token_ids
from .sources import page_starts_from_offsets
from .support import token_logprob

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConversationFit:
    """What a question will be asked with: the earlier turns kept (the oldest dropped first when the conversation
    would pass its allowance) and the ids after the document."""

    num_dropped: int  # oldest turns left out of the prompt
    ids: list[int]  # after the document prefix: kept turns, the question, the assistant header


@dataclass(frozen=True)
class Decoded:
    """How an answer's decoding ended."""

    text: str
    num_tokens: int
    first_at: float | None  # perf_counter() of the first token; None when there was none
    stopped: bool  # ``should_stop`` turned true
    looped: bool  # the repetition guard stopped an answer that repeated itself
    logprobs: tuple[float, ...] = ()  # log p of each answer token under the model's own (unguarded) logits
    token_ids: tuple[int, ...] = ()  # the answer's tokens, in order (the support check's claim tokens)


def stream_answer(model, tokenizer, logits: torch.Tensor, forward: Callable[[list[int]], torch.Tensor],
                  asked: float, *, max_new_tokens: int, temperature: float, top_p: float,
                  should_stop: Callable[[], bool] | None,
                  repetition_guard: RepetitionGuard | None, seed: int = 0) -> Generator[AnswerChunk, None, Decoded]:
    """Yields a chunk per answer token, from ``logits`` (the last prompt position's) onward; ``forward``
    appends a token and returns the next logits. ``asked`` is the question's perf_counter() (for the TTFT).
    Returns how it ended: the final chunk is the caller's. ``seed``: the sampling's generator."""
    decoder = IncrementalDecoder(tokenizer)
    stop_ids = stop_token_ids(model, tokenizer)
    generator = torch.Generator(device="cpu").manual_seed(seed)  # (sampling only; greedy uses none)
    first_at, num_tokens, stopped, looped, answer, logprobs = None, 0, False, False, [], []
    for _ in range(max_new_tokens):
        raw = logits  # the support signal wants the model's confidence, not the guard's penalties
        if repetition_guard is not None:
            logits = repetition_guard.adjust(logits, answer)
        token = next_token(logits, temperature, top_p, generator)
        if token in stop_ids:
            break
        logprobs.append(token_logprob(raw, token))
        num_tokens += 1
        answer.append(token)
        first_at = first_at or time.perf_counter()
        new_text = decoder.push(token)
        yield AnswerChunk(decoder.text, new_text, num_tokens, first_at - asked,
                          answer_rate(num_tokens, first_at), done=False)
        if should_stop is not None and should_stop():
            stopped = True
            break
        if repetition_guard is not None and repetition_guard.loop_span(answer):
            looped = True
            break
        try:
            logits = forward([token])
        except ForwardInterrupted:  # a stop between layers of a (large model's) decode step
            stopped = True
            break
    return Decoded(decoder.text, num_tokens, first_at, stopped, looped, tuple(logprobs), tuple(answer))


def retrieval_heads(model, tokenizer) -> dict[int, list[int]] | None:
    """The model's retrieval heads (calibrated once per model, cached); None, logged, when they cannot be found."""
    try:
        return find_retrieval_heads(model, tokenizer, cache_dir=cache_dir())
    except Exception:  # sources are an extra: an answer never fails over them
        logger.warning("could not find retrieval heads; answering without sources", exc_info=True)
        return None


def warm_up(model, tokenizer) -> threading.Thread:
    """Finds the model's retrieval heads (a short needle calibration, cached on disk) on a background thread, so the
    first answer's sources do not wait for it; the first answer calls ``retrieval_heads`` again and takes the cache."""
    thread = threading.Thread(target=retrieval_heads, args=(model, tokenizer), name="retrieval-heads", daemon=True)
    thread.start()
    return thread


def document_page_starts(pages, starts) -> list[tuple[int, str]]:
    """(first token, page label) of each of the document's ``pages`` (``DocumentTokens.pages``), from the token offsets
    kept at tokenization (``DocumentTokens.starts``); none where the tokenizer gave no offsets."""
    if starts is None:
        if pages:
            logger.info("the tokenizer gives no offsets: this document's sources name no page")
        return []
    return page_starts_from_offsets(pages, starts)
