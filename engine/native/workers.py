"""A fixed pool of threads whose torch ops each run on one core: the pool, not the op, is the parallelism.

Its user: host attention's torch tile (``kv/host_attention.py``, where no C compiler exists; the C kernel has its own
pthread pool, and the weights' GEMVs theirs, ``split_pool.h``), which splits a head group's sequence into
cache-sized tiles and runs one tile per worker. torch releases the GIL inside every op, so Python threads run tiles truly at once;
but an op called from a thread with the default settings would also start its own OpenMP team of every core,
and N workers would oversubscribe the machine N-fold. Each worker therefore sets its own intra-op threads to 1.

``torch.set_num_threads`` has one process-wide side effect: threads that start using torch *later* copy its
value when they first run an op. So each worker initialises torch's per-thread state first (then its own
setting is the only one that changes), and once every worker has started, the caller's thread count is put
back: the model's threads (the main thread, a UI's generation thread) keep all cores.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from ..errors import InputError

logger = logging.getLogger(__name__)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class TorchWorkers:
    """``num_threads`` started threads, each running torch ops single-threaded, under inference mode."""

    def __init__(self, num_threads: int):
        if num_threads < 1:
            raise InputError(f"num_threads must be >= 1, got {num_threads}")
        self.num_threads = num_threads
        caller_threads = torch.get_num_threads()
        started = threading.Barrier(num_threads + 1)
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix="headinfer-host",
                                        initializer=_single_threaded)
        # Every worker must have started (and run its initializer) before the caller's setting is restored,
        # or a late worker would copy that value instead of 1. Blocking each on one barrier starts them all.
        for _ in range(num_threads):
            self._pool.submit(started.wait)
        started.wait()
        torch.set_num_threads(caller_threads)
        logger.info("host attention: %d worker threads, one core each", num_threads)

    def submit(self, fn: Callable, *args) -> Future:
        return self._pool.submit(_in_inference_mode, fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


def _single_threaded() -> None:
    torch.get_num_threads()  # initialises this thread's torch state from the process-wide value first ...
    torch.set_num_threads(1)  # ... so that this changes this thread's setting (and, until restored, the global)


def _in_inference_mode(fn: Callable, *args):
    # Grad mode is per thread: without this, writing into buffers the caller made under inference mode raises.
    with torch.inference_mode():
        return fn(*args)


@functools.cache
def shared_workers() -> TorchWorkers:
    """The process's one pool, one thread per usable core (caches and sessions share the machine's cores)."""
    return TorchWorkers(usable_cores())
