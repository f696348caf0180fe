"""Teacher-forced log-probs of a given continuation on a session's cached K/V: ``continuation_logprobs``.

Scoring, not generation: one forward of the context and the continuation after whatever the cache holds (the
document), the log-prob of each continuation token read off the logits before it, and the cache cropped back to
where it was, so the next question sees the same cache. Used by the counterfactual support signal
(``support_counterfactual``) to ask how likely a recorded answer is under the question and under another one, and
by the reverse question (``support_reverse``: ``candidate_logprobs``, which entity fills the blank).
"""

from __future__ import annotations

import torch

from ..cache import cache_argument
from ..errors import InputError


def continuation_logprobs(model, cache, context: list[int], target: list[int]) -> list[float]:
    """log P(``target[i]`` | the cached tokens, ``context``, ``target[:i]``) per target token. ``context``: the ids
    between the cache's end and the target (a question turn and the assistant header); at least one, as the
    logits that predict ``target[0]`` are its last token's. The cache ends as it began."""
    if not context or not target:
        raise InputError("teacher forcing needs at least one context token and one target token")
    start = cache.get_seq_length()
    if cache.restorable_length(start, states_advanced=True) != start:
        raise InputError("this hybrid model's fixed-size states cannot be cropped back after scoring")
    ids = list(context) + list(target)
    try:
        with torch.inference_mode():
            input_ids = torch.tensor([ids], device=model.device)
            logits = model(input_ids, **{cache_argument(model): cache}, use_cache=True,
                           logits_to_keep=len(target) + 1).logits[0, :-1]  # [targets, vocab]: each predicts the next
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            picked = logprobs.gather(1, torch.tensor(target, device=logprobs.device)[:, None])[:, 0]
    finally:
        cache.crop_to(start)
    return picked.tolist()


def candidate_logprobs(model, cache, context: list[int], candidates: list[list[int]]) -> list[list[float]]:
    """``continuation_logprobs`` of each of ``candidates`` after the one ``context``: the context read once, each
    candidate scored after it on its own (a multiple-choice cloze: which word fills the blank), so the extra
    cost per candidate is its own few tokens. The cache ends as it began."""
    if not context or not candidates or not all(candidates):
        raise InputError("scoring candidates needs at least one context token and one token per candidate")
    start = cache.get_seq_length()
    if cache.restorable_length(start, states_advanced=True) != start:
        raise InputError("this hybrid model's fixed-size states cannot be cropped back after scoring")
    argument = {cache_argument(model): cache}
    scored = []
    try:
        with torch.inference_mode():
            first = model(torch.tensor([list(context)], device=model.device), **argument, use_cache=True,
                          logits_to_keep=1).logits[0, -1]
            first = torch.log_softmax(first.float(), dim=-1)
            read = cache.get_seq_length()
            for candidate in candidates:
                picked = [float(first[candidate[0]])]
                if len(candidate) > 1:  # its later tokens, each predicted by the one before it
                    logits = model(torch.tensor([candidate[:-1]], device=model.device), **argument, use_cache=True,
                                   logits_to_keep=len(candidate) - 1).logits[0]
                    logprobs = torch.log_softmax(logits.float(), dim=-1)
                    later = torch.tensor(candidate[1:], device=logprobs.device)[:, None]
                    picked += logprobs.gather(1, later)[:, 0].tolist()
                    cache.crop_to(read)
                scored.append(picked)
    finally:
        cache.crop_to(start)
    return scored
