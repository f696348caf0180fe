"""Which entity does the document give this answer for? The reverse question: ``reverse_cloze``, ``reverse_margin``.

An answer copied from a neighbouring entity's string ("R 4.1.3" asked for 32-bit macOS; the page gives it for 32-bit
Windows) restates the question, so any score of the answer under the question reads the question's own words back
(``support_counterfactual``'s gain ran the wrong way for that reason). Turned round, the answer is given and the
entity is asked for: the question's entity word is blanked out of the question and out of the answer's echo of it,
and the model, on the document's cached K/V, is scored on filling the blank with the word asked against the competing
words of the same kind on the page (``teacher_forced.candidate_logprobs``). A right answer's document binds it to the
entity asked; a copy's binds it to the neighbour.

The rule, fixed before any score was read (``docs/benchmarks/support-held-out.md``): the entity words and the anchor
are ``support_counterfactual``'s (a question word with a digit or a capital that the document uses; the answer's rarest
own word on its cited pages). The word blanked is the rarest of the question's entity words that the anchor's sentence
and headings do not say (when it says them all, the rarest of all of them). The rivals are the anchor page's entity
words of the same kind (a version for a version, a name for a name) that neither the question nor the answer holds,
the nearest to the anchor first, at most ``RIVALS``. The margin is log P(word asked) - the best rival's, each the sum
over its tokens: low flags.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .support import content_words, stem
from .support_binding import _sections, _sentence
from .support_counterfactual import _anchor, _entity_spans, _key, _kind, _question_words
from .support_entity import _spans, line_weights

RIVALS = 3  # competing words scored per answer: each costs a forward of its few tokens after the shared turn
BLANK = "___"
CLOZE_PROMPT = ("Fill in the blank ({blank}) with the word the document gives, so that the answer is what the "
                "document says.\nQuestion: {question}\nAnswer: {answer}\nReply with the word only.")


@dataclass(frozen=True)
class ReverseCloze:
    """One answer's reverse question: the word asked, its rivals, the question and answer with the word blanked."""

    word: str
    rivals: tuple[str, ...]
    question: str
    answer: str

    @property
    def prompt(self) -> str:
        return CLOZE_PROMPT.format(blank=BLANK, question=self.question, answer=" ".join(self.answer.split()))


def _blanked(text: str, word: str) -> str:
    return re.sub(rf"(?<![\w.+-]){re.escape(word)}(?![\w+-]|\.\w)", BLANK, text)


def reverse_cloze(question: str, answer: str, document: str, pages: list[tuple[int, int]],
                  rivals: int = RIVALS) -> ReverseCloze | None:
    """The reverse question of ``answer`` to ``question`` on its cited ``pages`` ((start, end) offsets in
    ``document``), by the module's rule. None when the question has no entity word the document uses, none of the
    answer's own words is on those pages, or the page holds no rival of the blanked word's kind."""
    weights = line_weights(document)
    asked = [(s, e, w) for s, e, w in _entity_spans(question) if weights.get(_key(w), 0.0) > 0.0]
    at = _anchor(answer, question, document, pages, weights) if asked else None
    if at is None:
        return None
    lo, hi = _sentence(document, at)
    said = {w for _, _, w in _spans(document[lo:hi] + "\n" + _sections(document, at))}
    absent = [span for span in asked if _key(span[2]) not in said]
    word = max(absent or asked, key=lambda span: weights.get(_key(span[2]), 0.0))[2]
    page = next((start, end) for start, end in pages if start <= at < end)
    taken = ({_key(w) for _, _, w in _entity_spans(question)} | {_key(w) for _, w in _question_words(question)}
             | {stem(w) for w in content_words(answer)})
    found = sorted((abs(page[0] + start - at), w) for start, _, w in _entity_spans(document[page[0]:page[1]])
                   if _key(w) not in taken and weights.get(_key(w), 0.0) > 0.0 and _kind(w) == _kind(word))
    picked: list[str] = []
    for _, rival in found:
        if _key(rival) not in {_key(w) for w in picked} and len(picked) < rivals:
            picked.append(rival)
    if not picked:
        return None
    return ReverseCloze(word, tuple(picked), _blanked(question, word), _blanked(answer, word))


def reverse_margin(asked: list[float], rivals: list[list[float]]) -> float:
    """log P(the word asked) - the most likely rival's (each the sum of its tokens' log-probs)."""
    return sum(asked) - max(sum(rival) for rival in rivals)
