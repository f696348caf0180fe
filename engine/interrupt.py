"""Stopping a forward pass between decoder layers, so a cancel takes effect within about one layer's
work instead of a whole chunk's, which takes tens of seconds on a laptop CPU (docs/benchmarks/app-bounds.md).

Stock transformers models run unchanged: forward pre-hooks on each decoder layer, its attention and its
MLP ask ``should_stop`` and raise :class:`ForwardInterrupted`. The caller crops the cache back to where
the forward started, which leaves it at a chunk boundary, resumable.

Ctrl+C (``stop_on_ctrl_c``, the app's serving loop; on Windows a console's Ctrl+C is the same SIGINT to Python) stops
every forward of the process the same way, and the process ends only once they have and each read's last checkpoint
has landed: a thread still inside torch while the interpreter finalizes aborts it ("terminate called without an
active exception", exit status -6, seen before this).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from torch import nn

from .errors import ForwardInterrupted

logger = logging.getLogger(__name__)
_STOPPING = threading.Event()  # set by Ctrl+C: every forward stops at its next layer, every read checkpoints
_SERVING = threading.Event()  # within ``stop_on_ctrl_c``: every forward is stoppable (a library's only if asked)
_work = [0]  # forwards under way and reads checkpointing (``begin_work``): what a Ctrl+C waits for
_idle = threading.Condition()


@contextmanager
def interruptible(model: nn.Module, should_stop: Callable[[], bool] | None) -> Iterator[None]:
    """Inside the ``with``, forwards of ``model`` in this thread raise ``ForwardInterrupted`` at the next
    checkpoint once ``should_stop()`` is true, or once Ctrl+C stopped the process (``stopping``). Other threads
    using the same (shared) model are not affected."""
    if should_stop is None and not _SERVING.is_set():  # (a library caller's forward, no hooks: as fast as stock)
        yield
        return
    owner, stop = threading.get_ident(), or_stopping(should_stop)

    def check(module: nn.Module, args) -> None:
        if threading.get_ident() == owner and stop():
            raise ForwardInterrupted(f"stopped before {type(module).__name__}")

    handles = [module.register_forward_pre_hook(check) for module in checkpoints(model)]
    begin_work()
    try:
        yield
    finally:
        end_work()
        for handle in handles:
            handle.remove()


def stopping() -> bool:
    """Whether Ctrl+C asked this process to stop (``stop_on_ctrl_c``)."""
    return _STOPPING.is_set()


def or_stopping(should_stop: Callable[[], bool] | None) -> Callable[[], bool]:
    """``should_stop`` that is also true once Ctrl+C asked the process to stop (a loop between forwards asks it)."""
    if should_stop is None:
        return _STOPPING.is_set
    return lambda: _STOPPING.is_set() or should_stop()


def begin_work() -> None:
    """Counts work a Ctrl+C waits for until ``end_work`` (a forward under way, a read's checkpoints)."""
    with _idle:
        _work[0] += 1


def end_work() -> None:
    with _idle:
        _work[0] -= 1
        _idle.notify_all()


@contextmanager
def stop_on_ctrl_c(wait_seconds: float = 120.0) -> Iterator[None]:
    """Serving inside the ``with`` (in the main thread): Ctrl+C stops every forward of the process at its next layer,
    then raises ``KeyboardInterrupt`` as before (Gradio closes its server on it). Leaving it waits up to
    ``wait_seconds`` for them to stop and for each read's last checkpoint to land; a second Ctrl+C ends the wait."""
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if previous in (None, signal.SIG_IGN):  # signals reach the main thread only; an ignored Ctrl+C stays ignored
        yield
        return

    def on_ctrl_c(signum, frame) -> None:
        if not _STOPPING.is_set():
            logger.info("Ctrl+C: stopping the reads and answers under way; each read keeps a checkpoint of what it "
                        "read, and continues from there at the next start")
        _STOPPING.set()
        if not callable(previous):
            raise KeyboardInterrupt
        previous(signum, frame)  # Python's own handler raises KeyboardInterrupt

    signal.signal(signal.SIGINT, on_ctrl_c)
    _SERVING.set()
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _SERVING.clear()
        _STOPPING.set()  # serving is over: nothing more computes
        started = time.monotonic()
        try:
            with _idle:
                done = _idle.wait_for(lambda: _work[0] == 0, wait_seconds)
        except KeyboardInterrupt:
            done = None
        if done:
            logger.info("stopped in %.1f s: nothing is left computing", time.monotonic() - started)
        else:
            logger.warning("ending with work still under way (%s): a read continues from its last checkpoint",
                           "a second Ctrl+C" if done is None else f"still computing after {wait_seconds:.0f} s")


def checkpoints(model: nn.Module) -> list[nn.Module]:
    """The modules a forward may stop before: each decoder layer, and its attention and MLP."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(decoder, "layers", None)
    if layers is None:
        return []
    found = []
    for layer in layers:
        found.append(layer)
        found.extend(getattr(layer, name) for name in ("self_attn", "mlp") if isinstance(getattr(layer, name, None), nn.Module))
    return found


@contextmanager
def layer_callbacks(model: nn.Module, callback: Callable[[int, int], None] | None) -> Iterator[None]:
    """Inside the ``with``, ``callback(layer_index, num_layers)`` runs before each decoder layer of forwards in this
    thread (progress within a long chunk)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = list(getattr(decoder, "layers", None) or [])
    if callback is None or not layers:
        yield
        return
    owner = threading.get_ident()

    def make_hook(index: int):
        def hook(module: nn.Module, args) -> None:
            if threading.get_ident() == owner:
                callback(index, len(layers))
        return hook

    handles = [layer.register_forward_pre_hook(make_hook(i)) for i, layer in enumerate(layers)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
