"""Stopping a forward pass between decoder layers, so a cancel takes effect within about one layer's
work instead of a whole chunk's, which takes tens of seconds on a laptop CPU (docs/benchmarks/app-bounds.md).

Stock transformers models run unchanged: forward pre-hooks on each decoder layer, its attention and its
MLP ask ``should_stop`` and raise :class:`ForwardInterrupted`. The caller crops the cache back to where
the forward started, which leaves it at a chunk boundary, resumable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from torch import nn

from .errors import ForwardInterrupted


@contextmanager
def interruptible(model: nn.Module, should_stop: Callable[[], bool] | None) -> Iterator[None]:
    """Within the block, forwards of ``model`` in this thread raise ``ForwardInterrupted`` at the next
    checkpoint once ``should_stop()`` is true. Other threads using the same (shared) model are not affected."""
    if should_stop is None:
        yield
        return
    owner = threading.get_ident()

    def check(module: nn.Module, args) -> None:
        if threading.get_ident() == owner and should_stop():
            raise ForwardInterrupted(f"stopped before {type(module).__name__}")

    handles = [module.register_forward_pre_hook(check) for module in checkpoints(model)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


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
    """Within the block, ``callback(layer_index, num_layers)`` runs before each decoder layer of forwards in this
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
