"""Latency bounds for a shared machine: a bound stated for a core per runnable process, stretched by how
oversubscribed the cores are when it is checked (CI and this VM run two pytest workers, a browser and sometimes other
jobs on 2 cores)."""

from __future__ import annotations

import os


def stretched(seconds: float) -> float:
    """``seconds``, times the 1-minute load average over the cores when that is above 1: at load 10 on 2 cores every
    thread gets about a fifth of a core (a 1 s stop measured 1.24 s there, a 3 s cancel 3.27 s)."""
    return seconds * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def load() -> tuple[float, float, float]:
    """The load averages, to print beside a latency that missed its bound."""
    return os.getloadavg()
