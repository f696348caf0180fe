"""The GPU phases: modes x lengths, each measurement appended as it finishes, within time limits, resumable.

A *piece* is one phase for one mode; it stops starting new lengths when its ``time_limit`` (or the process
deadline) would be overrun by the projected cost of the next one. A mode that ran out of memory at one length
is recorded as out of memory (``inferred_from``) at longer ones without running them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from .modes import Mode, Runner, baseline_max_context
from .probes import failure_status, frontier, host_bytes_needed, time_decode, time_prefill
from ..records import ResultStore
from .search import largest_fitting
from .timing import release_memory
from .trace import profile_headinfer

logger = logging.getLogger(__name__)


@dataclass
class Sweep:
    runner: Runner
    store: ResultStore
    budget_gib: float | None = None
    time_limit: float = 540.0
    deadline: float | None = None  # time.monotonic() value for the whole process
    resume: bool = False
    repeats: int = 3
    decode_steps: int = 8
    flops_per_second: float = 2e14  # for choosing real vs filled frontier probes; set from the ceilings

    def piece_deadline(self) -> float:
        end = time.monotonic() + self.time_limit
        return end if self.deadline is None else min(end, self.deadline)

    def is_done(self, phase: str, mode: str | None, context: int | None = None) -> bool:
        return self.resume and self.store.is_done(phase, mode, context, self.budget_gib)

    def append(self, phase: str, mode: str | None, context: int | None, **metrics) -> dict:
        status = metrics.pop("status", "ok")
        return self.store.append(phase, mode, status=status, context=context, budget_gib=self.budget_gib, **metrics)

    # -- the phases ------------------------------------------------------------------------------
    def prefill(self, modes: list[Mode], lengths: list[int]) -> None:
        for mode in modes:
            self._lengths("prefill", mode, lengths, lambda n: time_prefill(
                self.runner, mode, n, repeats=self.repeats, max_seconds=60.0), growth=2)

    def decode(self, modes: list[Mode], capacities: list[int]) -> None:
        for mode in modes:
            self._lengths("decode", mode, capacities, lambda n: time_decode(
                self.runner, mode, n, steps=self.decode_steps), growth=1)

    def peak(self, modes: list[Mode], capacities: list[int]) -> None:
        """GPU peak against context (the frontier probe at each length), next to the planner's prediction."""
        for mode in modes:
            self._lengths("frontier", mode, capacities, lambda n: self._frontier(mode, n), growth=1)

    def max_context(self, modes: list[Mode], limit: int) -> None:
        """Largest context per mode: doubling then bisection with frontier probes, prediction alongside."""
        shape = self.runner.shape
        for mode in modes:
            if self.is_done("max-context", mode.name):
                continue
            host_cap = self._host_cap(mode, limit)
            if mode.is_headinfer:
                plan = self.runner.plan(mode, min(host_cap, limit))
                predicted = plan.max_context_tokens
                start = min(host_cap, predicted)
            else:
                predicted = baseline_max_context(shape, mode, self.runner.gpu_budget or 0, self.runner.chunk_size)
                start = max(predicted or 0, 4096)
            found = largest_fitting(lambda n: self._cached_frontier(mode, n)["status"] == "ok", start=start,
                                    limit=host_cap, deadline=self.piece_deadline())
            # A search cut short by time is not final: --resume continues it from the recorded probes.
            status = "partial" if found.is_cut_by_time else "ok" if found.tried else "skipped"
            self.append("max-context", mode.name, None, status=status,
                        measured=found.largest_ok, smallest_failed=found.smallest_failed,
                        is_host_bound=found.is_capped and host_cap < limit, is_capped=found.is_capped,
                        host_cap=host_cap, predicted=predicted, tried=found.tried, is_cut_by_time=found.is_cut_by_time)

    def profile(self, mode: Mode, context: int, table_path: Path) -> None:
        if self.is_done("profile", mode.name, context):
            return
        try:
            summary = profile_headinfer(self.runner, mode, context, table_path)
            self.append("profile", mode.name, context, **summary, table=str(table_path.name))
        except Exception as exc:  # an unattended run records the failure and goes on
            logger.exception("profile of %s failed", mode.name)
            self.append("profile", mode.name, context, status=failure_status(exc) or "error", reason=str(exc)[:300])
            release_memory(self.runner.device)

    # -- helpers ---------------------------------------------------------------------------------
    def _frontier(self, mode: Mode, capacity: int) -> dict:
        return frontier(self.runner, mode, capacity, flops_per_second=self.flops_per_second)

    def _cached_frontier(self, mode: Mode, capacity: int) -> dict:
        """A frontier probe, reusing an earlier record of the same probe when resuming (searches are long)."""
        if self.resume:
            for record in reversed(self.store.records):
                if (record["phase"], record["mode"], record["context"]) == ("frontier", mode.name, capacity) \
                        and record["status"] in ("ok", "oom", "host_oom", "refused") \
                        and record.get("budget_gib") == self.budget_gib \
                        and (record.get("run") or {}).get("gpu") == (self.store.stamp or {}).get("gpu"):
                    return {"status": record["status"], **record["metrics"]}
        metrics = self._frontier(mode, capacity)
        self.append("frontier", mode.name, capacity, **metrics)
        return {"status": self.store.records[-1]["status"], **metrics}

    def _host_cap(self, mode: Mode, limit: int) -> int:
        """Largest context (multiple of 1024) whose pinned store fits the host budget, at most ``limit``."""
        if self.runner.host_budget is None:
            return limit
        lo, hi = 0, limit
        while hi - lo > 1024:
            middle = (lo + hi) // 2 // 1024 * 1024 or 1024
            fits = host_bytes_needed(self.runner, mode, middle) <= self.runner.host_budget
            lo, hi = (middle, hi) if fits else (lo, middle)
        return hi if host_bytes_needed(self.runner, mode, hi) <= self.runner.host_budget else max(lo, 1024)

    def _last_measured(self, phase: str, mode: Mode, below: int) -> tuple[int, float] | None:
        """(context, wall seconds) of the longest earlier measurement below ``below`` (a resumed piece projects
        its first length from it instead of starting blind)."""
        if not self.resume:
            return None
        earlier = [r for r in self.store.records if (r["phase"], r["mode"], r["status"]) == (phase, mode.name, "ok")
                   and r.get("budget_gib") == self.budget_gib and (r["context"] or 0) < below
                   and r["metrics"].get("wall_s")]
        if not earlier:
            return None
        best = max(earlier, key=lambda r: r["context"])
        return best["context"], best["metrics"]["wall_s"]

    def pending(self, phase: str, modes: list[Mode], lengths: list[int] | None = None) -> bool:
        """Whether any measurement of this phase is still to be made (lets a resumed piece skip the model build)."""
        if not self.resume:
            return True
        record_phase = {"peak": "frontier"}.get(phase, phase)
        if lengths is None:
            return any(not self.is_done(record_phase, m.name) for m in modes)
        return any(not self.is_done(record_phase, m.name, n) for m in modes for n in lengths)

    def _lengths(self, phase: str, mode: Mode, lengths: list[int], measure, growth: int) -> None:
        """Runs ``measure(n)`` for each length in order, projecting each cost from the last (``growth``: 1 linear,
        2 quadratic) and stopping when the piece's time is up."""
        piece_end = self.piece_deadline()
        failed_at, last = None, None
        for length in sorted(lengths):
            if self.is_done(phase, mode.name, length):
                continue
            last = last or self._last_measured(phase, mode, length)
            if failed_at is not None:
                self.append(phase, mode.name, length, status=failed_at[1], inferred_from=failed_at[0])
                continue
            projected = 0.0 if last is None else last[1] * (length / last[0]) ** growth
            if time.monotonic() + projected > piece_end:
                logger.info("%s %s: %d tokens would take ~%.0f s, past this piece's time limit: stopping",
                            phase, mode.name, length, projected)
                self.append(phase, mode.name, length, status="skipped", reason="time", projected_s=projected)
                break
            started = time.monotonic()
            try:
                metrics = measure(length)
            except Exception as exc:
                status = failure_status(exc)
                if status is None:
                    logger.exception("%s %s at %d failed", phase, mode.name, length)
                metrics = {"status": status or "error", "reason": str(exc).splitlines()[0][:300] if str(exc) else ""}
            release_memory(self.runner.device)
            metrics.setdefault("wall_s", time.monotonic() - started)
            record = self.append(phase, mode.name, length, **metrics)
            if record["status"] in ("oom", "host_oom", "refused"):
                failed_at = (length, record["status"])
            elif record["status"] == "ok":
                last = (length, time.monotonic() - started)
