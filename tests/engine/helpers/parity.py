"""Head-wise logits against stock transformers' on the same inputs: the tolerances, the prompt, and the chunked and
stepwise reads both models make (tests/engine/test_parity.py and the weights runtimes' parity tests)."""

from __future__ import annotations

import torch
from transformers import DynamicCache

import engine

PROMPT_LEN = 45  # longer than the sliding windows (8), not a multiple of the chunk sizes the tests read it in
RTOL = 1e-5
BF16_RTOL = 2e-2  # bf16 rounds to 8 bits of mantissa; stock's kernels and ours sum in different orders


def rel_diff(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest difference relative to the largest expected value (what the tolerances bound)."""
    return float((actual - expected).abs().max() / expected.abs().max())


def prompt(vocab_size: int, length: int = PROMPT_LEN) -> torch.Tensor:
    return torch.randint(0, vocab_size, (1, length), generator=torch.Generator().manual_seed(7))


def stepwise_logits(stock, model, ids: torch.Tensor, steps: int = 12) -> tuple[list, list]:
    """Last-position logits, ([model's], [stock's]): the prompt (both in chunks of 16: ``model`` through a head-wise
    cache with every slot offloaded, stock through its own cache), then ``steps`` greedy decode steps on stock's
    tokens."""
    stock_cache = DynamicCache(config=stock.config)
    expected = [chunked_logits(stock, ids, stock_cache, 16)[:, -1]]
    cache = engine.HeadInferCache(model.config, resident_slots=0, chunk_size=16)
    actual = [chunked_logits(model, ids, cache, 16)[:, -1]]
    for _ in range(steps):
        token = expected[-1].argmax(-1, keepdim=True)
        expected.append(stock(token, past_key_values=stock_cache, use_cache=True).logits[:, -1])
        actual.append(model(token, past_key_values=cache, use_cache=True).logits[:, -1])
    return actual, expected


def stock_chunked(stock, ids: torch.Tensor, chunk: int) -> torch.Tensor:
    """Stock's logits of the prompt read in chunks of ``chunk`` through its own cache: the same inputs as a chunked
    head-wise read (Gemma 4's tiny configs move by more than the tolerance between chunkings in stock itself)."""
    return chunked_logits(stock, ids, DynamicCache(config=stock.config), chunk)


def chunked_logits(model, ids: torch.Tensor, cache, chunk: int) -> torch.Tensor:
    outs = [model(ids[:, s : s + chunk], past_key_values=cache, use_cache=True).logits
            for s in range(0, ids.shape[1], chunk)]
    return torch.cat(outs, dim=1)
