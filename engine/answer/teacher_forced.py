"""Teacher-forced log-probs of a given continuation on a session's cached K/V: ``continuation_logprobs``.

Scoring, not generation: one forward of the context and the continuation after whatever the cache holds (the
document), the log-prob of each continuation token read off the logits before it, and the cache cropped back to
where it was, so the next question sees the same cache. Used by the counterfactual support signal
(``support_counterfactual``) to ask how likely a recorded answer is under the question and under another one.
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
