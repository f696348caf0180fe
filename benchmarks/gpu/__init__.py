"""The one-call GPU session (gpu_all and its steps), pinned memory as a budget, prefill chunks' device memory."""
