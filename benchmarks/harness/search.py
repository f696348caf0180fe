"""Largest context a mode can hold: doubling until a probe fails, then bisection, within a deadline.

Pure (the probe and the clock are arguments), so the search itself is tested without a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class SearchResult:
    """``largest_ok`` is 0 when even ``start`` failed; ``smallest_failed`` is None when nothing failed."""

    largest_ok: int = 0
    smallest_failed: int | None = None
    tried: list[tuple[int, bool]] = field(default_factory=list)
    is_cut_by_time: bool = False
    is_capped: bool = False  # reached ``limit`` without a failure


def largest_fitting(probe: Callable[[int], bool], *, start: int, limit: int, resolution: float = 0.02,
                    granule: int = 1024, deadline: float | None = None,
                    clock: Callable[[], float] = time.monotonic) -> SearchResult:
    """Searches the largest context in [granule, limit] for which ``probe`` is True (memory grows with context).

    Contexts are multiples of ``granule``; bisection stops once the bracket is within ``resolution`` (relative)
    of the answer or one granule wide. ``deadline`` is a ``clock()`` value after which no new probe starts.
    """
    result = SearchResult()

    def attempt(context: int) -> bool | None:
        if deadline is not None and clock() >= deadline:
            result.is_cut_by_time = True
            return None
        ok = bool(probe(context))
        result.tried.append((context, ok))
        if ok:
            result.largest_ok = max(result.largest_ok, context)
        elif result.smallest_failed is None or context < result.smallest_failed:
            result.smallest_failed = context
        return ok

    context = _round(min(start, limit), granule)
    # Walk down from a failing start, up from a fitting one, to bracket the answer.
    ok = attempt(context)
    while ok is False and context > granule:
        context = _round(context // 2, granule)
        ok = attempt(context)
    top = _round(limit, granule)
    while ok and context < top:
        context = min(_round(context * 2, granule), top)
        ok = attempt(context)
    if ok and context >= top:
        result.is_capped = True
        return result
    if ok is None or result.smallest_failed is None or result.largest_ok == 0:
        return result
    while result.smallest_failed - result.largest_ok > max(granule, resolution * result.largest_ok):
        middle = _round((result.largest_ok + result.smallest_failed) // 2, granule)
        if middle in (result.largest_ok, result.smallest_failed):
            break
        if attempt(middle) is None:
            break
    return result


def _round(value: int, granule: int) -> int:
    return max(granule, value // granule * granule)
