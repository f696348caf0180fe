"""Whether the answer stays when the rival's question is asked: ``reask_overlap``.

A copy answers X for the entity asked (E) although the page gives X for a neighbour (E'): asked about E', the model
answers X again. A right answer's X belongs to E: asked about E', the model says something else. Teacher-forcing the
recorded answer under the swapped question failed because the answer echoes the question (``support_counterfactual``);
a *generated* re-answer echoes the swapped question instead, so only the answer's own key words are compared.

The rule, fixed before any score was read (2026-12-02 21:15 UTC, ``docs/benchmarks/support-held-out.md``): the
re-asked question is ``support_counterfactual.counterfactual_question`` (None: no signal, never flags), answered
greedily in a fresh conversation on the document's cached K/V as the app answers. The answer's key words are its
content words (``content_words``, stemmed) that neither the question asked nor the swapped one holds. Each weighs
its document rarity (``support_entity.line_weights``); a word the document never uses, and any word with a digit
(a version, a size, a year names one thing however often it is printed), weighs as the document's rarest word. A
key word is said again when the re-answer's stemmed content words hold it. The overlap is the said key words'
weight over all key words' weight, in [0, 1]: high means the same answer for another entity, and flags. None when
the answer has no key word of positive weight.
"""

from __future__ import annotations

from .support import content_words, stem
from .support_entity import line_weights


def _stems(text: str) -> set[str]:
    return {stem(word) for word in content_words(text)}


def key_weights(answer: str, question: str, swapped: str, document: str) -> dict[str, float]:
    """{stem: weight} of the answer's key words by the module's rule (its own words in neither question)."""
    weights = line_weights(document)
    rarest = max(weights.values(), default=1.0)
    own = _stems(answer) - _stems(question) - _stems(swapped)
    found = {}
    for word in own:
        weight = rarest if any(c.isdigit() for c in word) or word not in weights else weights[word]
        if weight > 0.0:
            found[word] = weight
    return found


def reask_overlap(answer: str, reanswer: str, question: str, swapped: str, document: str) -> float | None:
    """The weighted share of ``answer``'s key words (not in ``question`` nor ``swapped``) that ``reanswer``, the
    model's answer to ``swapped``, says too; None without a key word. High flags."""
    keys = key_weights(answer, question, swapped, document)
    if not keys:
        return None
    said = _stems(reanswer)
    return sum(weight for word, weight in keys.items() if word in said) / sum(keys.values())
