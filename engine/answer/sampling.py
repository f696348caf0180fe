"""Choosing the next token and turning token ids into streamed text."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InputError


def next_token(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> int:
    """Greedy when ``temperature`` is 0, else temperature + nucleus (top-p) sampling. logits: [vocab]."""
    if temperature < 0 or not 0 < top_p <= 1:
        raise InputError(f"temperature must be >= 0 and top_p in (0, 1], got {temperature}, {top_p}")
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


@dataclass(frozen=True)
class RepetitionGuard:
    """A sampling choice against answers that loop; off, decoding is the exact greedy continuation.

    Two parts: a repetition penalty (as in transformers' ``repetition_penalty``) on tokens of the answer's
    recent ``window`` tokens only (quoting the document stays free), and a stop when the answer's tail is the
    same span of ``min_span``..``max_span`` tokens ``repeats`` times back to back.
    """

    penalty: float = 1.1
    window: int = 64
    repeats: int = 3
    min_span: int = 3
    max_span: int = 64

    def __post_init__(self) -> None:
        if self.penalty < 1 or self.window < 0 or self.repeats < 2 or not 1 <= self.min_span <= self.max_span:
            raise ValueError(f"invalid repetition guard {self}")

    def adjust(self, logits: torch.Tensor, answer_ids: list[int]) -> torch.Tensor:
        """logits: [vocab]; a penalised copy (positive logits divided, negative ones multiplied)."""
        recent = answer_ids[-self.window:] if self.window else []
        if self.penalty == 1 or not recent:
            return logits
        index = torch.tensor(sorted(set(recent)), device=logits.device)
        chosen = logits.index_select(0, index)
        penalised = torch.where(chosen > 0, chosen / self.penalty, chosen * self.penalty)
        return logits.index_copy(0, index, penalised)

    def loop_span(self, answer_ids: list[int]) -> int:
        """Length of the span the answer's tail repeats ``repeats`` times (0 when it does not loop)."""
        n = len(answer_ids)
        for span in range(self.min_span, min(self.max_span, n // self.repeats) + 1):
            tail = answer_ids[n - span:]
            if all(answer_ids[n - (k + 1) * span : n - k * span] == tail for k in range(1, self.repeats)):
                return span
        return 0


def stop_token_ids(model, tokenizer) -> set[int]:
    """The end-of-sequence ids of the model's generation config, its config and its tokenizer."""
    ids = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        ids.update(value if isinstance(value, list) else [] if value is None else [value])
    return ids
