"""The allocation ledger against the plan: a tiny family's model, and the check that a cache's allocations stayed within
what its plan promised (the ledger's and the attention scratch's tests)."""

from __future__ import annotations

import torch
from archs import tiny_configs
from transformers import AutoModelForCausalLM

from engine.kv import ledger as kv_ledger
from engine.planning.allocations import SOURCES


def model_of(name: str):
    """The tiny family ``name``, random (seeded), with head-wise attention."""
    torch.manual_seed(1234)
    return AutoModelForCausalLM.from_config(tiny_configs()[name], attn_implementation="headinfer").eval()


def assert_within_plan(cache, *, with_sources: bool = False) -> None:
    """The cache's ledger peaked within its plan in every category and in all, and used most of what it planned."""
    planned, ledger = cache.plan.allocations, cache.ledger
    for category in kv_ledger.CATEGORIES:
        assert ledger.peak(category) <= planned[category], (category, ledger.peak(category), planned[category])
    counted = [c for c in kv_ledger.CATEGORIES if with_sources or c != SOURCES]
    allocated = sum(ledger.peak(c) for c in counted)
    promised = sum(planned[c] for c in counted)
    assert ledger.peak() <= promised  # what was held at once
    assert allocated >= 0.95 * promised, {c: (ledger.peak(c), planned[c]) for c in counted}
