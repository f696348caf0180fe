"""The counterfactual gain on the answer's own tokens only: ``own_token_gain``.

``support_counterfactual``'s gain averages every answer token, and the 1.5B's answers restate the question: under
the swapped question its echoed "macOS" is what becomes unlikely, a right answer or a copy alike, so the gain ran the
wrong way. Here only the answer's own tokens count (``support.claim_tokens``: a content word the question asked
does not hold), the claim the document has to bind to the entity asked. The rule was fixed before any score of it was
read (``docs/benchmarks/support-held-out.md``).
"""

from __future__ import annotations

from .support import claim_tokens


def own_token_gain(tokens: list[str], asked: list[float], swapped: list[float], question: str) -> float | None:
    """Mean over the answer's own tokens (``tokens``: their texts, joining into the answer) of log P(token |
    ``question``) - log P(token | the counterfactual question) (``asked``, ``swapped``: per token, in order). None
    when the answer has no token of its own (it only restates the question) or the lists differ in length."""
    if not (len(tokens) == len(asked) == len(swapped)):
        return None
    own = [i for i, mine in enumerate(claim_tokens(tokens, "".join(tokens), question)) if mine]
    if not own:
        return None
    return sum(asked[i] - swapped[i] for i in own) / len(own)
