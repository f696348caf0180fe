"""The app's own work: reading documents, bombs in uploads, reading-time estimates, the first start, the queue and
many visitors at once. Each is its own entry point: ``python -m benchmarks.app.<name>``."""
