"""How the attention function finds its layer's KV: an explicit, checked route the cache publishes.

A transformers attention module calls ``cache.update(key, value, layer_idx)`` and hands what it returns to the
attention function, which learns nothing else about the cache. ``HeadInferCache`` therefore publishes, per
thread, "layer ``layer_idx`` returned these key states and is attended by this owner"; the attention function
takes the entry for its module's ``layer_idx`` and checks it got those very key states. Anything else while a
head-wise forward is in flight (no ``layer_idx``, another index, key states replaced on the way) is an error,
never a silent attention over the chunk alone.

A forward's first layer clears what an interrupted one left (``HeadInferCache.begin_layer``).
"""

from __future__ import annotations

import threading

import torch

from ..errors import RouteError

_local = threading.local()


def _entries() -> dict[int, tuple[object, torch.Tensor]]:
    entries = getattr(_local, "entries", None)
    if entries is None:
        entries = _local.entries = {}
    return entries


def publish(layer_idx: int, owner: object, key: torch.Tensor) -> None:
    """Announces that ``key`` (this chunk's key states of layer ``layer_idx``) is attended by ``owner``."""
    _entries()[layer_idx] = (owner, key)


def take(layer_idx: int | None, key: torch.Tensor) -> object | None:
    """The owner published for this layer and these key states; ``None`` if no head-wise forward is in flight."""
    entries = _entries()
    entry = entries.pop(layer_idx, None) if layer_idx is not None else None
    if entry is not None:
        owner, published = entry
        if published is key:
            return owner
        raise RouteError(
            f"layer {layer_idx}: the key states reaching attention are not the ones HeadInferCache returned "
            "(the model transformed them after the cache update); head-wise attention cannot run on them")
    if entries:
        raise RouteError(
            f"attention of layer {layer_idx} found no KV route while HeadInferCache layers {sorted(entries)} are "
            "in flight (the attention module's layer_idx does not match the cache layer it updated)")
    return None


def clear() -> None:
    _entries().clear()
