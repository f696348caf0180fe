"""A happens-before checker for the streams seam: vector clocks over streams *and* host threads.

The algorithm of PyTorch's CUDA sanitizer (``torch.cuda._sanitizer``), extended to host threads. Every agent
(a stream, or a host thread) has a vector clock. Its own entry counts its operations; the others say how far
it has seen theirs. Edges, all taken at the moment the operation is *issued* (not when an emulated stream
happens to run it, so the verdict does not depend on timing):

- an operation issued on stream S by thread T: S learns everything T has seen (host work before a launch
  precedes it);
- ``event.record(S)`` snapshots S's clock into the event; ``S.wait_event(E)`` joins that snapshot into S;
  ``E.synchronize()`` / ``S.synchronize()`` by thread T join it into T (never into a stream);
- a task submitted to a worker thread starts knowing what its submitter knew; waiting for its future joins
  what the task knew at its end into the waiter.

Buffers touched through the seam declare their accesses (``read`` / ``write`` of a tensor's bytes by the current
agent). Two accesses to overlapping bytes conflict when at least one writes; a conflicting pair that is not
ordered by the clocks is a race: ``RaceError`` names both call sites. Races are also kept in ``races`` so a test
can assert there were none even where the error was raised on a worker thread and reported as something else.
"""

from __future__ import annotations

import logging
import threading
import traceback
from dataclasses import dataclass

import torch

from ..errors import RaceError

logger = logging.getLogger(__name__)

Clock = dict  # agent -> count
_MAX_ACCESSES = 4096  # per storage: accesses not yet covered by a later ordered one (tiny runs never get near)


@dataclass
class _Access:
    start: int  # byte range [start, stop) of the storage
    stop: int
    is_write: bool
    agent: object
    epoch: int  # the agent's own count at the access
    site: str
    what: str
    issuer: object = None  # a stream's access: the host thread that issued it, and that thread's count then
    issuer_epoch: int = 0


def _site() -> str:
    """The first few frames outside the seam: enough to find both sides of a race."""
    frames = [f for f in traceback.extract_stack(limit=14)[:-1]
              if not f.filename.endswith(("kv/happens_before.py", "kv/streams.py", "kv/emulated.py"))]
    return " <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in reversed(frames[-4:]))


class HappensBefore:
    """Vector clocks of every agent, and the last accesses of every storage touched through the seam."""

    def __init__(self, raise_on_race: bool = True):
        self.raise_on_race = raise_on_race
        self.races: list[str] = []
        self.num_checked = 0
        self._lock = threading.RLock()
        self._clocks: dict[object, Clock] = {}
        self._storages: dict[int, list[_Access]] = {}
        self._warned = False

    # -- agents ------------------------------------------------------------------------------------
    @staticmethod
    def thread() -> tuple[str, int]:
        return ("thread", threading.get_ident())

    def _clock(self, agent) -> Clock:
        clock = self._clocks.get(agent)
        if clock is None:
            clock = self._clocks[agent] = {agent: 1}
        return clock

    def _join(self, into, snapshot: Clock) -> None:
        clock = self._clock(into)
        for agent, count in snapshot.items():
            if clock.get(agent, 0) < count:
                clock[agent] = count

    def snapshot(self, agent) -> Clock:
        with self._lock:
            return dict(self._clock(agent))

    def join(self, into, snapshot: Clock | None) -> None:
        if snapshot:
            with self._lock:
                self._join(into, snapshot)

    def issue(self, stream) -> None:
        """An operation is issued on ``stream`` by this thread: the stream sees what the thread has seen."""
        with self._lock:
            self._join(stream, self._clock(self.thread()))

    def tick(self, agent) -> None:
        with self._lock:
            clock = self._clock(agent)
            clock[agent] += 1

    # -- accesses ----------------------------------------------------------------------------------
    def access(self, agent, tensor: torch.Tensor, is_write: bool, what: str) -> None:
        if tensor.numel() == 0:
            return
        storage = tensor.untyped_storage()
        base = storage.data_ptr()
        start = tensor.data_ptr() - base
        stop = start + _span_bytes(tensor)
        site = _site()
        with self._lock:
            self.num_checked += 1
            clock = self._clock(agent)
            epoch = clock[agent]
            # A stream runs its operations in issue order, but two threads issuing to one stream are ordered
            # only if the second knew of the first's issue (a thread's clock counts its issues too).
            issuer = None if isinstance(agent, tuple) else self.thread()
            issuer_clock = self._clock(issuer) if issuer is not None else clock
            new = _Access(start, stop, is_write, agent, epoch, site, what, issuer,
                          issuer_clock[issuer] if issuer is not None else 0)
            if issuer is not None:
                issuer_clock[issuer] += 1
            accesses = self._storages.setdefault(base, [])
            kept = []
            for old in accesses:
                overlaps = old.start < stop and start < old.stop
                if old.agent == agent:
                    ordered = old.issuer == issuer or issuer_clock.get(old.issuer, 0) > old.issuer_epoch
                else:
                    ordered = clock.get(old.agent, 0) >= old.epoch
                if overlaps and (is_write or old.is_write) and not ordered:
                    self._report(old, new)
                # An ordered access whose bytes this one covers can never race with a later one that this one
                # does not race with (a write covers reads and writes; a read covers reads by its agent).
                covered = overlaps and ordered and old.start >= start and old.stop <= stop and (
                    is_write or (not old.is_write and old.agent == agent))
                if not covered:
                    kept.append(old)
            kept.append(new)
            if len(kept) > _MAX_ACCESSES:  # a bound for long runs; a dropped access can no longer be checked
                if not self._warned:
                    logger.warning("happens-before checker: over %d live accesses on one buffer, dropping the "
                                   "oldest (races with them go unseen)", _MAX_ACCESSES)
                    self._warned = True
                kept = kept[-_MAX_ACCESSES:]
            self._storages[base] = kept
            clock[agent] = epoch + 1

    def forget(self, tensor: torch.Tensor) -> None:
        """The storage is being freed (its next owner starts with no history)."""
        with self._lock:
            self._storages.pop(tensor.untyped_storage().data_ptr(), None)

    def report_missing_wait(self, what: str) -> None:
        message = f"unordered: {what} at {_site()}"
        self.races.append(message)
        logger.error("race: %s", message)
        if self.raise_on_race:
            raise RaceError(message)

    def _report(self, old: _Access, new: _Access) -> None:
        kind = {(True, True): "write-write", (True, False): "write-read", (False, True): "read-write"}[
            (old.is_write, new.is_write)]
        message = (f"unordered {kind} on bytes [{max(old.start, new.start)}, {min(old.stop, new.stop)}): "
                   f"{_name(old.agent)} {'wrote' if old.is_write else 'read'} {old.what} at {old.site}; then "
                   f"{_name(new.agent)} {'writes' if new.is_write else 'reads'} {new.what} at {new.site}")
        self.races.append(message)
        logger.error("race: %s", message)
        if self.raise_on_race:
            raise RaceError(message)


def _span_bytes(tensor: torch.Tensor) -> int:
    """Bytes from the tensor's first element to one past its last (a view's holes included)."""
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    return (last + 1) * tensor.element_size()


def _name(agent) -> str:
    if isinstance(agent, tuple) and agent and agent[0] == "thread":
        return f"host thread {agent[1]}"
    return f"stream {getattr(agent, 'name', agent)!s}"
