"""CPU studies: host attention against the read bandwidth, the decode and prefill kernels, their pools and prefetch
hints. Each is its own entry point: ``python -m benchmarks.cpu.<name>``."""
