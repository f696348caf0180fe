"""The self-check: tiny models through the real stream path, compared with stock."""
