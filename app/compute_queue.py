"""The line for the compute device: one heavy job (a read, an answer) at a time, first come first served.

Gradio's own queue shows a waiting visitor only a faint "queue: 1/1" and cannot be left. This one is the
handlers': while a visitor waits, their status line says their place in line and an estimated wait, and
Cancel, Stop or closing the tab takes them out of the line at once. Each job states how long it expects to
take (the plan's reading-time estimate, or an answer's tokens at the decode rate last seen), so those behind
it can be told. A long job made of pieces (a read, chunk by chunk) gives way between them (``give_way``): when
someone waits, it goes to the back of the line and goes on when it is at the front again, so a question asked
during a long read waits for one chunk, not for the whole read.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field

from app.render import format_seconds, queue_status


STEADY = 0.1  # a new estimate within 10% of the wait being counted down does not replace it
STEADY_SECONDS = 1.0  # nor one within a second of it


@dataclass(eq=False)
class Ticket:
    """One job's place in line."""

    what: str  # "reading 2,400 tokens", "answering a question": said to those behind it
    expected_seconds: float
    number: int = 0
    joined: float = field(default_factory=time.monotonic)
    started: float | None = None  # when it reached the front
    piece_seconds: float | None = None  # a job that gives way: how long its last piece took
    piece_started: float = 0.0
    shown_seconds: float | None = None  # the wait its visitor was last told (None: it was at the front at once)

    def remaining_seconds(self, now: float) -> float:
        """What is left of its expected time, counting down as it runs (a job past its estimate is taken to need a
        second more; a running job's ``ComputeQueue.expect`` keeps the estimate current)."""
        if self.started is None:
            return self.expected_seconds
        return max(self.expected_seconds - (now - self.started), 1.0)

    def seconds_before_giving_way(self, now: float) -> float:
        """How long those behind it wait for it: its current piece when it gives way between pieces, else the rest."""
        if self.piece_seconds is None:
            return self.remaining_seconds(now)
        piece = self.piece_seconds if self.started is None else self.piece_seconds - (now - self.piece_started)
        return min(max(piece, 0.5), self.remaining_seconds(now))


class ComputeQueue:
    """The line for the compute device. ``join`` then ``wait_front`` (a generator of "waiting" sentences), work,
    then ``leave`` (always, in a ``finally``)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._line: list[Ticket] = []  # the first holds the device
        self._numbers = itertools.count(1)

    def join(self, what: str, expected_seconds: float) -> Ticket:
        ticket = Ticket(what, max(float(expected_seconds), 0.0), next(self._numbers))
        with self._changed:
            self._line.append(ticket)
            if len(self._line) == 1:
                ticket.started = time.monotonic()
        return ticket

    def leave(self, ticket: Ticket) -> None:
        """Out of the line, running or waiting; safe to call twice."""
        with self._changed:
            if ticket in self._line:
                self._line.remove(ticket)
                if self._line and self._line[0].started is None:
                    self._line[0].started = time.monotonic()
                self._changed.notify_all()

    def expect(self, ticket: Ticket, seconds: float) -> None:
        """A running job's better estimate of the seconds still ahead of it. One within ``STEADY`` of what the line
        already counts down from is taken as the rate's jitter and left out: an answer's estimate moves a little with
        every token, and the wait shown would jump up and down instead of counting down
        (docs/benchmarks/app-bounds.md)."""
        with self._changed:
            if ticket.started is None:
                return
            now = time.monotonic()
            current = ticket.remaining_seconds(now)
            if abs(seconds - current) <= max(STEADY_SECONDS, STEADY * current):
                return
            ticket.expected_seconds = now - ticket.started + max(seconds, 0.0)

    def position(self, ticket: Ticket) -> int:
        """0: at the front (it runs); 1: next; ... (-1: not in line)."""
        with self._changed:
            return self._line.index(ticket) if ticket in self._line else -1

    def wait_seconds(self, ticket: Ticket) -> float:
        """The estimated wait: what is left of every job ahead of it."""
        now = time.monotonic()
        with self._changed:
            ahead = self._line[: self._line.index(ticket)] if ticket in self._line else []
            return sum(job.seconds_before_giving_way(now) for job in ahead)

    def num_waiting(self) -> int:
        with self._changed:
            return max(len(self._line) - 1, 0)

    def in_line(self, ticket: Ticket, should_leave: Callable[[], bool],
                view: Callable[[str], object]) -> Generator[object, None, bool]:
        """``wait_front``, yielding ``view(status line)`` with the place in line and the wait: what a page shows."""
        waiting = self.wait_front(ticket, should_leave)
        while True:
            try:
                text = next(waiting)
            except StopIteration as done:
                return done.value
            yield view(queue_status(self.position(ticket), text))

    def wait_front(self, ticket: Ticket, should_leave: Callable[[], bool], *,
                   every: float = 0.25) -> Generator[str, None, bool]:
        """Waits until ``ticket`` is at the front of the line, yielding a sentence on the wait about every second;
        returns True once it is, False when ``should_leave()`` turned true first (then it has left the line)."""
        last_said = float("-inf")
        while True:
            with self._changed:
                if self._line and self._line[0] is ticket:
                    return True
            if should_leave():
                self.leave(ticket)
                return False
            if time.monotonic() - last_said >= 1.0:
                last_said = time.monotonic()
                yield self.describe(ticket)
            with self._changed:
                if not (self._line and self._line[0] is ticket):
                    self._changed.wait(every)

    def give_way(self, ticket: Ticket, should_leave: Callable[[], bool], on_wait: Callable[[str], None],
                 piece_seconds: float, *, every: float = 0.25) -> bool:
        """Between two pieces of ``ticket``'s job (it holds the device): when others wait, it goes to the back of the
        line, behind all of them, and waits for the front again, telling ``on_wait`` about the wait about every second.
        Returns True when it may go on (at once when nobody waits), False when ``should_leave()`` turned true while
        it waited (then it has left the line). ``piece_seconds``: how long its last piece took (those who join
        later are told they wait about that long for it)."""
        with self._changed:
            ticket.piece_seconds = piece_seconds
            if len(self._line) > 1 and self._line[0] is ticket:
                now = time.monotonic()
                ticket.expected_seconds, ticket.started = ticket.remaining_seconds(now), None
                self._line.remove(ticket)
                self._line.append(ticket)
                self._line[0].started = now
                self._changed.notify_all()
        waiting = self.wait_front(ticket, should_leave, every=every)
        while True:
            try:
                on_wait(next(waiting))
            except StopIteration as done:
                ticket.piece_started = time.monotonic()
                return done.value

    def describe(self, ticket: Ticket) -> str:
        position = self.position(ticket)
        with self._changed:
            running = self._line[0].what if self._line else ""
        ticket.shown_seconds = self.wait_seconds(ticket)
        return (f"Waiting for the compute device: {ordinal(position)} in line, about "
                f"{format_seconds(ticket.shown_seconds)} (another visitor is {running}).")


def ordinal(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"
