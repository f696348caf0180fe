"""How long an answer still takes, for those waiting behind it in the device's line (``app.compute_queue``).

A running answer's rest is estimated from its own request and what it has done: the tokens it has written, its
limit (max tokens), its rate so far, and this model's earlier answers *longer than it already is* (an answer 30
tokens long is no longer expected to stop at the usual 20: the median of the earlier ones that went past 30 is what
it likely reaches). When none went that far, it is taken to stop three quarters of the way to its limit. The wait
shown once assumed the usual length for every answer, and said seconds left for minutes past it.
"""

from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass, field

# When no earlier answer was as long as this one is: it stops this far from here toward its limit. Three quarters
# keeps the first estimate within a factor of two for most ends, the limit included (docs/benchmarks/app-bounds.md).
TOWARD_LIMIT = 3 / 4
DEFAULT_SECONDS = 20.0  # what an answer is expected to take before any was timed here


@dataclass
class AnswerRecord:
    """The last answers written here: their lengths, decode rates and the time from their last token to their end
    (sources, support check). Appended to by the asking handler; read for every estimate."""

    lengths: collections.deque[int] = field(default_factory=lambda: collections.deque(maxlen=20))
    rates: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=5))
    finish: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=5))
    seconds: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=5))  # whole answers

    def record(self, num_tokens: int, tokens_per_second: float, finish_seconds: float, whole_seconds: float) -> None:
        self.lengths.append(num_tokens)
        if tokens_per_second > 0:
            self.rates.append(tokens_per_second)
        self.finish.append(max(finish_seconds, 0.0))
        self.seconds.append(whole_seconds)

    def tokens_left(self, written: int, max_tokens: int) -> float:
        """Tokens an answer that has written ``written`` of at most ``max_tokens`` likely still writes."""
        room = max(max_tokens - written, 0)
        longer = [n for n in self.lengths if n > written]
        if longer:
            return min(statistics.median(longer) - written, room)
        return room * TOWARD_LIMIT

    def seconds_left(self, written: int, max_tokens: int, tokens_per_second: float) -> float:
        """Seconds a running answer likely has left: its tokens left at its own rate (the last answers' before it has
        one), then what the last answers took after their last token."""
        rate = tokens_per_second if tokens_per_second > 0 else self.rate()
        finish = statistics.median(self.finish) if self.finish else 0.0
        if rate is None:
            return statistics.median(self.seconds) if self.seconds else DEFAULT_SECONDS
        return self.tokens_left(written, max_tokens) / rate + finish

    def expected_seconds(self, max_tokens: int) -> float:
        """Seconds a whole answer of at most ``max_tokens`` is expected to take, before it starts (its question's
        reading apart)."""
        return self.seconds_left(0, max_tokens, 0.0)

    def rate(self) -> float | None:
        return statistics.median(self.rates) if self.rates else None
