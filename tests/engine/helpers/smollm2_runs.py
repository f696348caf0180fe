"""The embedded SmolLM2's parity runs: natural prose to read, available offline, and stock transformers' greedy
answer to compare a head-wise or weights-runtime answer with (tests/engine/test_smollm2.py, the CPU runtime's tests)."""

from __future__ import annotations

import inspect

import torch

NEW_TOKENS = 32


def real_text(min_chars: int = 8000) -> str:
    """Natural English prose available offline: the documentation of a few standard-library modules."""
    import argparse  # noqa: E401
    import collections
    import json
    import logging
    import textwrap
    import unittest

    parts = [inspect.getdoc(m) for m in (textwrap, argparse, json, logging, collections, unittest)]
    parts += [inspect.getdoc(f) for f in (textwrap.wrap, textwrap.dedent, json.dumps, json.loads, logging.basicConfig)]
    text = "\n\n".join(p for p in parts if p)
    assert len(text) >= min_chars, len(text)
    return text


def stock_greedy(model, ids: list[int]) -> list[int]:
    """Stock transformers' greedy answer (``sdpa`` attention) to ``ids``: ``NEW_TOKENS`` token ids."""
    model.set_attn_implementation("sdpa")
    out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, len(ids):].tolist()
