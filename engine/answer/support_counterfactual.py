"""Whether the answer belongs to what was asked: the counterfactual question and its log-prob gain.

An answer copied from a neighbouring entity's string ("GCC 10.3.0" asked for macOS; the page gives it for Windows)
is as likely, or more, when the question names that other entity. A right answer is less likely when the question
asks about another one. So: swap the question's distinguishing words (its names and versions: "macOS", "32-bit",
"MiKTeX") for the competing entity found nearest the answer's own words on its cited pages, teacher-force the
recorded answer under both questions on the document's cached K/V (``teacher_forced.continuation_logprobs``), and
take mean log P(answer | asked) - mean log P(answer | counterfactual) (``counterfactual_gain``): low means the
answer does not depend on what was asked.

The rule, fixed before any score was read (``docs/benchmarks/support-held-out.md``): the question's entity words
are its tokens with a digit or a capital (not a sentence's first word), used off some line of the document. The anchor is
the answer's rarest own word (not in the question) on its cited pages. The words swapped are the question's entity
words that the anchor's sentence and headings do not say (a copy's asked-for platform); when it says them all,
the question's rarest entity word. Each is replaced by the nearest entity word of the same kind (a version for a
version, a name for a name) on the anchor's page that neither the question nor the answer holds, or dropped.
"""

from __future__ import annotations

import re

from .support import _STOPWORDS, _WORD, content_words, stem
from .support_binding import _sections, _sentence
from .support_entity import _spans, line_weights


def _entity_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, word) of ``text``'s entity words: a digit or a capital letter (a sentence's or line's first
    word only for a capital past its first letter), not a stopword."""
    found = []
    for match in _WORD.finditer(text):
        word = match.group()
        if word.lower() in _STOPWORDS or not any(c.isalnum() for c in word):
            continue
        before = text[:match.start()].rstrip(" \t\"'“‘(")
        capital = word[0].isupper() and bool(before) and before[-1] not in ".!?:\n"
        if any(c.isdigit() for c in word) or capital or any(c.isupper() for c in word[1:]):
            found.append((match.start(), match.end(), word))
    return found


def _question_words(question: str) -> list[tuple[int, str]]:
    return [(start, word) for start, _, word in _spans(question)]


def _kind(word: str) -> str:
    return "version" if any(c.isdigit() for c in word) else "name"


def _key(word: str) -> str:
    return stem(word.lower().strip("./-") or word.lower())


def _anchor(answer: str, question: str, document: str, pages: list[tuple[int, int]],
            weights: dict[str, float]) -> int | None:
    """The document offset of the answer's rarest own word on its cited ``pages`` (the first such occurrence)."""
    own = {stem(w) for w in content_words(answer) - content_words(question)}
    best = None  # (weight, -order, offset)
    for order, (start, end) in enumerate(pages):
        for offset, _, word in _spans(document[start:end]):
            if word in own:
                candidate = (weights.get(word, 0.0), -order, -(start + offset))
                best = candidate if best is None or candidate > best else best
    return None if best is None else -best[2]


def counterfactual_question(question: str, answer: str, document: str, pages: list[tuple[int, int]]) -> str | None:
    """``question`` with its distinguishing words swapped for the competing entity nearest the answer's words on
    its cited ``pages`` ((start, end) offsets in ``document``), or dropped where none is found (the module's rule).
    None when the question has no entity word the document uses off some line, or nothing changes."""
    weights = line_weights(document)
    asked = [(s, e, w) for s, e, w in _entity_spans(question) if weights.get(_key(w), 0.0) > 0.0]
    if not asked:
        return None
    at = _anchor(answer, question, document, pages, weights)
    said, page = set(), None
    if at is not None:
        lo, hi = _sentence(document, at)
        said = {w for _, _, w in _spans(document[lo:hi] + "\n" + _sections(document, at))}
        page = next((start, end) for start, end in pages if start <= at < end)
    absent = [span for span in asked if _key(span[2]) not in said]
    targets = absent or [max(asked, key=lambda span: weights.get(_key(span[2]), 0.0))]
    taken = {_key(w) for _, _, w in _entity_spans(question)} | {_key(w) for _, w in _question_words(question)} | {stem(w) for w in content_words(answer)}
    rivals = []  # (distance from the anchor, word): the page's entity words the question and answer do not hold
    if page is not None:
        for start, end, word in _entity_spans(document[page[0]:page[1]]):
            if _key(word) not in taken and weights.get(_key(word), 0.0) > 0.0:
                rivals.append((abs(page[0] + start - at), word))
    rivals.sort()
    swapped, used = question, set()
    for _, _, word in sorted(targets, key=lambda span: -span[0]):
        rival = next((w for _, w in rivals if _kind(w) == _kind(word) and _key(w) not in used), None)
        if rival is not None:
            used.add(_key(rival))
        swapped = re.sub(rf"(?<![\w.+-]){re.escape(word)}(?![\w+-]|\.\w)", rival or "", swapped)
    swapped = re.sub(r"\s+([?.,;:])", r"\1", re.sub(r"[ \t]{2,}", " ", swapped)).strip()
    return None if swapped == question.strip() else swapped


def counterfactual_gain(asked: list[float], counterfactual: list[float]) -> float:
    """Mean log-prob of the answer's tokens under the question asked minus under the counterfactual one."""
    return sum(asked) / len(asked) - sum(counterfactual) / len(counterfactual)
