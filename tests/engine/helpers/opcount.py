"""Counting the aten operators a piece of code dispatches (the lean-hot-loop checks)."""

from __future__ import annotations

import collections

from torch.utils._python_dispatch import TorchDispatchMode


class OpCounter(TorchDispatchMode):
    """``with OpCounter() as c: ...`` then ``c.ops``: aten operator name -> calls."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))
