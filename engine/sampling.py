"""Choosing the next token and turning token ids into streamed text."""

from __future__ import annotations

import torch


def next_token(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> int:
    """Greedy when ``temperature`` is 0, else temperature + nucleus (top-p) sampling. logits: [vocab]."""
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"temperature must be >= 0 and top_p in (0, 1], got {temperature}, {top_p}")
    if temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)
    sorted_probs, order = torch.sort(probs, descending=True)
    # Keep the smallest prefix whose mass reaches top_p (always at least the most likely token).
    keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p
    sorted_probs = sorted_probs * keep
    choice = torch.multinomial(sorted_probs / sorted_probs.sum(), 1, generator=generator)
    return int(order[choice])


class IncrementalDecoder:
    """Decodes a growing list of ids into text, holding back bytes of an unfinished UTF-8 character."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def push(self, token: int) -> str:
        """Adds one token; returns the text it completes (possibly empty)."""
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""  # a multi-byte character is split across tokens: wait for the rest
        new_text = text[len(self.text):] if text.startswith(self.text) else text
        self.text = text
        return new_text


def stop_token_ids(model, tokenizer) -> set[int]:
    """The end-of-sequence ids of the model's generation config, its config and its tokenizer."""
    ids = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        ids.update(value if isinstance(value, list) else [] if value is None else [value])
    return ids
