"""A read's time here as a pure function of three things: the document (its tokens, read in forwards), this
machine's measured rate, and its measured load.

    seconds = scale · rate.seconds(forwards, start, stop) · (probe now / rate.probe_seconds)^α

``rate``: the background measurement's three terms (``read_rate``: per forward, per token, per (query, key) pair),
or where a read was recorded before any measurement landed, the planner's FLOP model (``ReadEstimator``);
``scale``: what the recorded reads said of that rate (the geometric mean of each read's time over what the rate
predicted for it, both brought to the rate's load); α: fixed per device (``CPU_LOAD_EXPONENT`` on a CPU, 1 on a GPU).

Why nothing else enters: the estimate before this re-fitted the split between its terms after every read (the FLOP
model scaled to one or two reads, the free two-term fit from three, α learned once the reads' probes differed, and
the first read switched from the measured rate to that fit), so one read moved a short file's estimate and a long
file's by different factors (issue 51: one file's whole-book estimate went 42:24 → 49:51 → 28:39 within minutes).
Now a read or a measurement moves every file's estimate by one factor, the rate's (``scale``), a change of load
by that load's factor (the probe's ratio to the power α), and nothing else moves it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from .costs import Chunk, Probe
from .read_rate import ReadEstimate, ReadRate

CPU_LOAD_EXPONENT = 0.65  # α on a CPU: a read slows as the load probe's time to this power (estimate-error.md)
_FIRST_READ_SPREAD = 0.5  # before any read, the measured rate's estimate is shown as /1.5 to x1.5
_ONE_READ_SPREAD = 0.25  # one read is all there is to judge the scale by: at least ±25%
_MIN_SPREAD = 0.15  # a range is never narrower than ±15%


@dataclass(frozen=True)
class ReadModel:
    """A measured ``rate`` times the ``scale`` the recorded reads gave it, at the load its probe measured, slowed as
    the load probe's time to the power ``exponent``. ``misfits``: each recorded read's time over what the scale of
    the others predicted (leave one out; the range's share of what the reads say); ``reads``: how many there are."""

    rate: ReadRate
    exponent: float
    scale: float = 1.0
    reads: int = 0
    misfits: tuple[float, ...] = ()

    def load_factor(self, probe_seconds: float) -> float:
        """How much slower than at the rate's measurement a read runs at the load ``probe_seconds`` measures."""
        return (probe_seconds / self.rate.probe_seconds) ** self.exponent

    def likely(self, num_forwards: int, start: int, stop: int, probe_seconds: float) -> float:
        """Seconds to read tokens ``[start, stop)`` in ``num_forwards`` forwards at the load ``probe_seconds``."""
        return self.scale * self.rate.seconds(num_forwards, start, stop) * self.load_factor(probe_seconds)

    def estimate(self, num_forwards: int, start: int, stop: int, probe: Probe) -> ReadEstimate:
        """(low, likely, high): the likely value, widened by what the reads say of the scale (±50% before any read,
        ±25% after one, else their held-out misfits and at least ±15%) and by the load's spread; never below 0."""
        likely = self.likely(num_forwards, start, stop, probe.seconds)
        load = 1 + max(probe.spread * self.exponent, 0.0)  # a factor either way: a time is never negative
        if self.reads == 0:
            low_factor, high_factor = 1 / (1 + _FIRST_READ_SPREAD), 1 + _FIRST_READ_SPREAD
        elif not self.misfits:
            low_factor, high_factor = 1 - _ONE_READ_SPREAD, 1 + _ONE_READ_SPREAD
        else:
            low_factor = min(min(self.misfits), 1 - _MIN_SPREAD)
            high_factor = max(max(self.misfits), 1 + _MIN_SPREAD)
        return ReadEstimate(likely * low_factor / load, likely, likely * high_factor * load)


def calibrated(rate: ReadRate, reads: list[list[tuple[Chunk, float]]], exponent: float) -> ReadModel:
    """``rate`` scaled to the recorded ``reads`` (each a list of (chunk, load probe seconds around it))."""
    ratios = [r for read in reads if (r := read_ratio(rate, read, exponent)) is not None]
    if not ratios:
        return ReadModel(rate, exponent)
    logs = [math.log(r) for r in ratios]
    misfits = tuple(math.exp(log - statistics.fmean(logs[:i] + logs[i + 1:])) for i, log in enumerate(logs)
                    ) if len(logs) > 1 else ()
    return ReadModel(rate, exponent, math.exp(statistics.fmean(logs)), len(ratios), misfits)


def read_ratio(rate: ReadRate, read: list[tuple[Chunk, float]], exponent: float) -> float | None:
    """A read's time over what ``rate`` predicts for it, each chunk's seconds brought from the load its probes
    measured to the rate's (``(rate's probe / chunk's probe)^exponent``); None when nothing is predicted."""
    actual = sum(c.seconds * (rate.probe_seconds / probe) ** exponent for c, probe in read)
    predicted = sum(rate.seconds(1, c.position, c.position + c.tokens) for c, _ in read)
    ratio = actual / predicted if predicted > 0 else math.nan
    return ratio if math.isfinite(ratio) and ratio > 0 else None
