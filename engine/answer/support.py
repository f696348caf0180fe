"""Whether the document supports an answer: "the document may not say this".

Two signals the engine already holds after an answer, so the check costs a few reductions:

- ``document_share``: of the attention the answer's retrieval heads paid (``sources.attention_mass``), the share
  that landed on the document's pages rather than on the system prompt, the question and the answer itself. An
  answer read off a page looks at the page; an invented one looks at the question and at what it wrote.
- ``mean_logprob``: the mean log-probability the model gave the tokens it wrote (from the logits the decode
  computed anyway). An invented default or version number is written with less confidence than a copied one.

The answer is flagged when either is under its threshold (``SupportThresholds``). The defaults are a starting
point, not yet fitted on the CPU default model: ``benchmarks/support_eval.py`` fits them per model on half of
``benchmarks/data/support_eval.json`` and reports the other half (``docs/benchmarks/support.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

_SINK = 4  # the prompt's first tokens: an "attention sink" in most models, on no page and on no question


@dataclass(frozen=True)
class SupportThresholds:
    """An answer is supported when both signals reach their minimum."""

    min_document_share: float = 0.30
    min_mean_logprob: float = -0.60

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_document_share <= 1.0:
            raise ValueError(f"min_document_share must be in [0, 1], got {self.min_document_share}")
        if self.min_mean_logprob > 0.0:
            raise ValueError(f"min_mean_logprob must be <= 0, got {self.min_mean_logprob}")


@dataclass(frozen=True)
class Support:
    """The signals of one answer and the decision drawn from them."""

    document_share: float | None  # None without a sources pass (no retrieval heads, sources off)
    mean_logprob: float | None  # None for an empty answer
    is_supported: bool


def document_share(mass: torch.Tensor, document_range: tuple[int, int],
                   pages: list[tuple[int, str]]) -> float | None:
    """The share of ``mass`` ([L], ``attention_mass``) on the document's pages (from the first page marker, or
    the document range without pages) among all positions after the attention sink; None when there is none."""
    start, stop = document_range
    first = pages[0][0] if pages else start
    first = max(first, start, _SINK)
    total = float(mass[_SINK:].sum())
    if total <= 0 or first >= stop:
        return None
    return float(mass[first:stop].sum()) / total


def mean_logprob(logprobs: list[float]) -> float | None:
    """The mean log-probability of an answer's tokens; None for an empty answer."""
    return sum(logprobs) / len(logprobs) if logprobs else None


def decide(share: float | None, logprob: float | None,
           thresholds: SupportThresholds = SupportThresholds()) -> Support:
    """Flags an answer whose attention stayed off the pages or whose tokens were written unsure. A missing
    signal does not flag: without sources the answer is judged on its probabilities alone."""
    low_share = share is not None and share < thresholds.min_document_share
    unsure = logprob is not None and logprob < thresholds.min_mean_logprob
    return Support(share, logprob, not (low_share or unsure))


def token_logprob(logits: torch.Tensor, token: int) -> float:
    """log p(token) under ``logits`` ([vocab], the raw logits of the step that chose it)."""
    value = float(torch.log_softmax(logits.float(), dim=-1)[token])
    return value if math.isfinite(value) else -100.0
