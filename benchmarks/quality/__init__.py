"""Answer quality: parity with stock transformers, needle in a haystack (exact and 8-bit KV), 8-bit KV on real text."""
