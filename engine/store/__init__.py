"""Saved documents: snapshots of a prefilled KV cache, their format, files and fingerprints."""
