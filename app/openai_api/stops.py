"""Stop sequences over a streamed answer: text is handed on only once no stop sequence can still begin in it, and
the answer ends (without the sequence) where one appears, as OpenAI's ``stop`` does."""

from __future__ import annotations


class StopWatch:
    """Feed it the answer's whole text so far (``push``); it returns the new text safe to send."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(stops)
        self.sent = 0  # characters handed on so far
        self.hit = False  # a stop sequence appeared: the answer is over
        self.text = ""  # the answer as sent (up to the stop sequence)

    def push(self, text: str) -> str:
        if self.hit:
            return ""
        cut = min((found for found in (text.find(stop) for stop in self.stops) if found >= 0), default=-1)
        if cut >= 0:
            self.hit = True
            return self._send(text, cut)
        # Hold back a tail that could be the start of a stop sequence still being written.
        hold = max((n for stop in self.stops for n in range(min(len(stop) - 1, len(text)), 0, -1)
                    if text.endswith(stop[:n])), default=0)
        return self._send(text, len(text) - hold)

    def finish(self, text: str) -> str:
        """The rest once the answer ended: nothing more can come, so no tail is held back."""
        new = self.push(text)
        return new if self.hit else new + self._send(text, len(text))

    def _send(self, text: str, end: int) -> str:
        end = max(end, self.sent)
        new, self.sent = text[self.sent:end], end
        self.text = text[:end]
        return new
