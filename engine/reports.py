"""What a ``DocumentSession`` reports while it reads a document and answers: progress, answer chunks, and
the cancellation of a read."""

from __future__ import annotations

import time
from dataclasses import dataclass



@dataclass(frozen=True)
class PrefillProgress:
    tokens_done: int
    tokens_total: int
    tokens_per_second: float
    elapsed: float
    remaining_seconds: float | None = None  # from the work left (attention grows with context) at the rate so far

    @property
    def fraction(self) -> float:
        return self.tokens_done / self.tokens_total if self.tokens_total else 1.0

    @property
    def eta_seconds(self) -> float | None:
        if self.remaining_seconds is not None:
            return self.remaining_seconds
        if self.tokens_per_second <= 0:
            return None
        return (self.tokens_total - self.tokens_done) / self.tokens_per_second


@dataclass(frozen=True)
class AnswerChunk:
    text: str  # the whole answer so far
    new_text: str
    num_tokens: int
    ttft: float | None  # seconds from the question to the first answer token
    tokens_per_second: float  # decode rate after the first token
    done: bool
    stopped: bool = False
    looped: bool = False  # the repetition guard stopped an answer that repeated itself
    sources: tuple = ()  # engine.answer.sources.Source, largest share first (final chunk only)
    sources_seconds: float = 0.0  # the extra attention pass that found them
    support: object = None  # engine.answer.support.Support: does the document support it (final chunk only)


def answer_rate(num_tokens: int, first_at: float | None) -> float:
    """Decode tokens per second after the first token (which ``first_at`` timed)."""
    if first_at is None or num_tokens < 2:
        return 0.0
    return (num_tokens - 1) / max(time.perf_counter() - first_at, 1e-9)
