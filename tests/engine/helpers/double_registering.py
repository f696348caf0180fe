"""A runtime whose registrations are refused the way a real refusal comes: by registering every range twice.

The second ``cudaHostRegister`` of a range fails (already registered). A real refusal leaves nothing registered,
so the first registration is undone before the refusal is returned: the first GPU run's version kept it, the
memory was freed still registered, and the next test's ``model.cuda()`` failed with ``invalid argument``.
"""

from __future__ import annotations


class DoubleRegistering:
    """Wraps a runtime (``engine.kv.pinned.CudaRuntime`` on a GPU, a fake on the CPU)."""

    def __init__(self, runtime):
        self._runtime = runtime

    def host_register(self, pointer: int, num_bytes: int) -> int:
        first = self._runtime.host_register(pointer, num_bytes)
        if first != 0:
            return first
        refused = self._runtime.host_register(pointer, num_bytes)
        self._runtime.host_unregister(pointer)  # as a real refusal: nothing stays registered
        return refused

    def __getattr__(self, name):
        return getattr(self._runtime, name)
