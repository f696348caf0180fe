"""Answering: the decode loop, sampling, sources and retrieval heads."""
