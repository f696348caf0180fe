"""Answer quality: needle in a haystack (exact and 8-bit KV) and 8-bit KV on real text. Each is its own entry point:
``python -m benchmarks.quality.<name>``."""
