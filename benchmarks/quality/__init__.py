"""Answer quality: parity with stock, needle in a haystack (exact and 8-bit KV), 8-bit KV on real text, which small
model answers (``model_eval``) and the support flag (``support_*``). Each is its own entry point:
``python -m benchmarks.quality.<name>``."""
