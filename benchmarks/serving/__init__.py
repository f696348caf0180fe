"""Benchmarks of the app as a server: the OpenAI-compatible endpoint against the page (``api_follow_up``)."""
