"""Untrusted files are read in a box: a child process with a memory limit (``RLIMIT_AS`` and ``RLIMIT_DATA``, set
in the child before it reads anything) and a time limit (killed past ``BoxLimits.seconds`` of its processor time), so
a 1 MB bomb can neither take gigabytes of the app's memory nor hold up uploads for minutes. Every way a file can fail in the
box (a refusal, a parser's error, out of memory, killed, crashed) comes back as a :class:`DocumentError` naming
that file and the reason; the other files of a set still read.

The children are started with ``spawn`` (the app has threads and torch loaded, which ``fork`` would copy
half-alive; Windows has only ``spawn``), kept for the next file, and exit after ``idle_seconds`` without one.
Without the ``resource`` module (Windows) the time limit alone holds: a bomb there can take memory until it is
killed, but not hold up uploads. As ``spawn`` requires, the program's main module must be safe to import (its work
under ``if __name__ == "__main__"``, as launch.py's is): the child imports it before it reads.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

import psutil

from app.documents.archive import format_size
from app.documents.document import DocumentError
from app.documents.extract import Extracted, extract
from app.documents.limits import BoxLimits
from process_env import shaped

try:
    import resource
except ImportError:  # Windows
    resource = None

logger = logging.getLogger(__name__)

# Whether the child can cap its own memory (tests force the fallback). Without it (Windows: no RLIMIT_AS, and a job
# object is not reachable from pure Python) the app polls the child's resident memory and kills it past the limit.
HAS_RESOURCE = resource is not None and not shaped()
POLL_SECONDS = 0.05  # the fallback's look at the child's memory: a bomb grows ~100 MB in that time at most
MAX_CHILDREN = 2  # at most this many files read at once; more wait for a free child
CPU_POLL_SECONDS = 0.25  # how often the reader's processor time is looked at


class _Starved(Exception):
    """The reader was given too little processor time to finish (a busy machine, not the file)."""

    def __init__(self, cpu_seconds: float, wall_seconds: float):
        super().__init__(f"{cpu_seconds:.1f} s of CPU in {wall_seconds:.1f} s")
        self.cpu_seconds, self.wall_seconds = cpu_seconds, wall_seconds


_SHARED: list[Box] = []
_SHARED_LOCK = threading.Lock()


def shared_box() -> Box:
    """The app's one box (made on first use), whose children every upload is read in."""
    with _SHARED_LOCK:
        if not _SHARED:
            _SHARED.append(Box())
        return _SHARED[0]


class Box:
    """Reads files in child processes under ``limits``; thread-safe (each read takes a child of its own)."""

    def __init__(self, limits: BoxLimits = BoxLimits()):
        self.limits = limits
        self._context = multiprocessing.get_context("spawn")
        self._idle: list[_Child] = []
        self._lock = threading.Lock()
        self._children_free = threading.BoundedSemaphore(MAX_CHILDREN)

    def extract(self, path: str | Path, name: str) -> Extracted:
        """``app.documents.extract.extract`` of one file, in a child.

        Raises:
            DocumentError: the file's own refusal, or that it took too long, too much memory or crashed the reader.
        """
        with self._children_free:
            try:
                child = self._take()
            except OSError as exc:  # no process could be started (out of processes or memory)
                logger.error("could not start a reader for %s: %s", name, exc)
                raise DocumentError(f"{name} could not be read now: the server could not start a reader for it "
                                    f"({exc.strerror or exc}). Try again in a moment.") from exc
            started = time.monotonic()
            try:
                outcome, value = child.ask((str(path), name), self.limits.seconds, self.limits.wall_seconds,
                                           None if HAS_RESOURCE else self.limits.memory_bytes)
            except MemoryError:  # the fallback's poll saw it past the limit
                child.kill()
                logger.warning("the reader of %s passed %s of memory: it was killed", name,
                               format_size(self.limits.memory_bytes))
                raise self._out_of_memory(name) from None
            except TimeoutError:
                child.kill()
                logger.warning("reading %s passed %.0f s of its reader's time: it was killed", name,
                               self.limits.seconds)
                raise DocumentError(f"{name} took longer than {self.limits.seconds:.0f} s to read, so it was "
                                    "stopped: it is too large or built to stall a reader. Split it, or save it as "
                                    "PDF or plain text and upload that.") from None
            except _Starved as starved:
                child.kill()
                logger.warning("reading %s had %.0f s of CPU in %.0f s: the machine is too busy", name,
                               starved.cpu_seconds, starved.wall_seconds)
                raise DocumentError(f"{name} could not be read now: the machine is too busy (its reader had "
                                    f"{starved.cpu_seconds:.0f} s of processor time in {starved.wall_seconds:.0f} s)."
                                    " Try again in a moment.") from None
            except (EOFError, OSError):  # the child died: the kernel's kill, or PDFium aborting on a failed malloc
                code = child.kill()
                logger.warning("the reader of %s died (exit code %s) after %.1f s", name, code,
                               time.monotonic() - started)
                if code is not None and code < 0:  # a signal: SIGABRT, SIGSEGV or SIGKILL, from running out
                    raise self._out_of_memory(name) from None
                raise DocumentError(f"{name} could not be read: its reader stopped (exit code {code}). "
                                    "Re-download or re-export it and try again.") from None
            if outcome == "memory":
                child.kill()  # its heap may be in pieces: the next file gets a fresh child
                raise self._out_of_memory(name)
            self._give_back(child)
            if outcome == "refused":
                raise DocumentError(value)
            if outcome == "error":
                raise DocumentError(f"{name} could not be read: the file is damaged or not what its extension "
                                    f"says ({value}). Re-download or re-export it and try again.")
            return value

    def close(self) -> None:
        """Stops the idle children (a child reading is stopped by its own read's end)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for child in idle:
            child.kill()

    def _out_of_memory(self, name: str) -> DocumentError:
        limit = f" ({format_size(self.limits.memory_bytes)})"
        return DocumentError(f"{name} needed more memory than one file may take to read{limit}, so it was stopped: "
                             "it inflates far beyond its size on disk (a decompression bomb) or is damaged. Save "
                             "it as PDF or plain text and upload that.")

    def _take(self) -> _Child:
        with self._lock:
            while self._idle:
                child = self._idle.pop()
                # Half its idle time: a child about to exit on its own is not sent a file.
                if child.is_alive() and time.monotonic() - child.idle_since < self.limits.idle_seconds / 2:
                    return child
                child.kill()
        return _Child(self._context, self.limits)

    def _give_back(self, child: _Child) -> None:
        child.idle_since = time.monotonic()
        with self._lock:
            self._idle.append(child)


class _Child:
    """One reader process and its end of the pipe."""

    def __init__(self, context, limits: BoxLimits):
        self._connection, theirs = context.Pipe()
        memory = limits.memory_bytes if HAS_RESOURCE else None
        self._process = context.Process(target=serve, args=(theirs, memory, limits.idle_seconds),
                                        name="document-reader", daemon=True)
        self._process.start()
        theirs.close()
        self.idle_since = time.monotonic()
        self._ready = False  # until the child says so, once its imports are done

    def is_alive(self) -> bool:
        return self._process.is_alive()

    def ask(self, request: tuple[str, str], seconds: float, wall_seconds: float,
            memory_bytes: int | None = None) -> tuple[str, object]:
        """The child's answer to ``request``; ``TimeoutError`` past ``seconds`` of its own processor time (a file
        that stalls its reader), ``_Starved`` past ``wall_seconds`` on the clock short of that (a busy machine),
        ``EOFError`` when it died, and ``MemoryError`` when ``memory_bytes`` is given and its resident memory passes
        it (looked at every ``POLL_SECONDS``: the fallback where the child cannot cap its own)."""
        started = time.monotonic()
        self._connection.send(request)
        used = None if not self._ready else self._cpu_seconds()  # a new child's start (its imports) is not the file's
        step = CPU_POLL_SECONDS if memory_bytes is None else POLL_SECONDS
        while (wall := time.monotonic() - started) < wall_seconds:
            if self._connection.poll(step):
                answer = self._connection.recv()
                if answer[0] != "ready":
                    return answer
                self._ready, used, started = True, self._cpu_seconds(), time.monotonic()
                continue
            if memory_bytes is not None and self._resident() > memory_bytes:
                raise MemoryError
            if used is not None and self._cpu_seconds() - used > seconds:
                raise TimeoutError
        raise _Starved(self._cpu_seconds() - (used or 0.0), wall)

    def _cpu_seconds(self) -> float:
        try:
            times = psutil.Process(self._process.pid).cpu_times()
            return times.user + times.system
        except psutil.Error:  # it is gone: the next poll sees the closed pipe
            return 0.0

    def _resident(self) -> int:
        try:
            return psutil.Process(self._process.pid).memory_info().rss
        except psutil.Error:  # it is gone: the next poll sees the closed pipe
            return 0

    def kill(self) -> int | None:
        """Ends the child (at once: it may be inside PDFium) and returns its exit code."""
        self._process.kill()
        self._process.join(5)
        self._connection.close()
        return self._process.exitcode


def serve(connection: Connection, memory_bytes: int | None, idle_seconds: float) -> None:
    """The child: caps its own memory, then reads the files it is sent until none comes for ``idle_seconds``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a console's Ctrl+C reaches us too: the app ends us, or its pipe
    if memory_bytes is not None:
        limit_memory(memory_bytes)
    connection.send(("ready", None))
    while connection.poll(idle_seconds):
        try:
            path, name = connection.recv()
        except EOFError:  # the app closed the pipe
            return
        try:
            answer = ("ok", extract(Path(path), name))
        except DocumentError as exc:
            answer = ("refused", str(exc))
        except MemoryError:
            answer = ("memory", None)
        except Exception as exc:  # a parser's own error on a hostile file: a reason for this file, not a crash
            logger.warning("reading %s failed", name, exc_info=True)
            answer = ("error", type(exc).__name__)
        try:
            connection.send(answer)
        except MemoryError:
            connection.send(("memory", None))
        if answer[0] == "memory":
            return


def limit_memory(memory_bytes: int) -> None:
    """Caps this process's address space and data segment at ``memory_bytes`` (never above a limit already set)."""
    for kind in (resource.RLIMIT_AS, resource.RLIMIT_DATA):
        soft, hard = resource.getrlimit(kind)
        cap = min(limit for limit in (memory_bytes, soft, hard) if limit != resource.RLIM_INFINITY)
        resource.setrlimit(kind, (cap, hard))
