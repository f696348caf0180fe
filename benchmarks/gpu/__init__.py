"""The one-call GPU session (``gpu_all`` and its steps), pinned memory as a budget, and the device memory of a
prefill chunk (windowed attention, the attention scratch).
Each is its own entry point: ``python -m benchmarks.gpu.<name>``."""
