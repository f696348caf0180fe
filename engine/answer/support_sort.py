"""The rival of the same sort, found distributionally: ``sort_mates`` and ``sort_question``.

The re-ask (``support_reask``) tells a copy from a right answer only when the rival asked about is a real neighbour
of the entity asked ("32-bit macOS" for "32-bit Windows", "the png terminal" for "the pdf terminal");
``counterfactual_question``'s nearest capitalised word is often of another sort ("64 Windows", "for GUI"). A word's
sort is read off the document itself: words printed in the same slots are of one sort.

The rule, fixed before any score of it was read (2026-12-02 21:56 UTC, ``docs/benchmarks/support-held-out.md``):

- Tokens are ``support._WORD``'s matches, keyed as ``support_counterfactual._key`` (lowercased, stemmed). A token's
  contexts are its immediate neighbours on the same line: ("before", key) for the token just before it and
  ("after", key) for the one just after, each only when that neighbour is not a stopword (``support._STOPWORDS``)
  and has a letter or digit. Sibling lines of the same shape are not used.
- A word's sort-mates are the document's other keys of the same kind (a version, with a digit, for a version; a
  name for a name) and positive ``line_weights`` weight, that share at least one distinct context with it, ranked
  by how many distinct contexts they share (ties: the mate printed first in the document).
- The question's candidates are its content words (any case, not stopwords) whose key the document uses with
  positive weight. A candidate's usable mates are its sort-mates that neither the question nor the answer holds
  (by key); its strength is its top usable mate's shared-context count.
- The word swapped is the strongest candidate among those the anchor's sentence and headings do not say
  (``support_counterfactual._anchor`` on the cited pages; no anchor: none is said), else the strongest of all (ties:
  the rarer candidate by ``line_weights``, then the earlier in the question). Its rival is its top usable mate,
  written as the document most often prints it; every occurrence of the word in the question is replaced.
- None when no candidate has a usable mate.
"""

from __future__ import annotations

import functools
import re
from collections import Counter, defaultdict

from .support import _STOPWORDS, _WORD, content_words, stem
from .support_binding import _sections, _sentence
from .support_counterfactual import _anchor, _key, _kind
from .support_entity import _spans, line_weights


def _is_word(word: str) -> bool:
    return word.lower() not in _STOPWORDS and any(c.isalnum() for c in word)


@functools.lru_cache(maxsize=4)  # per document: its contexts are gathered once, not once per answer
def _contexts(document: str) -> tuple[dict[str, frozenset], dict[str, int], dict[str, str]]:
    """({key: its distinct contexts}, {key: the offset it is first printed at}, {key: its most printed form})."""
    contexts: dict[str, set] = defaultdict(set)
    first: dict[str, int] = {}
    forms: dict[str, Counter] = defaultdict(Counter)
    offset = 0
    for line in document.splitlines(keepends=True):
        tokens = [(m.start(), m.group()) for m in _WORD.finditer(line)]
        for i, (start, word) in enumerate(tokens):
            if not _is_word(word):
                continue
            key = _key(word)
            first.setdefault(key, offset + start)
            forms[key][word] += 1
            for side, j in (("before", i - 1), ("after", i + 1)):
                if 0 <= j < len(tokens) and _is_word(tokens[j][1]):
                    contexts[key].add((side, _key(tokens[j][1])))
        offset += len(line)
    common = {key: counts.most_common(1)[0][0] for key, counts in forms.items()}
    return {k: frozenset(v) for k, v in contexts.items()}, first, common


def sort_mates(word: str, document: str) -> list[tuple[str, int]]:
    """[(key, distinct contexts shared)] of ``word``'s sort-mates in ``document``, strongest first (the rule)."""
    contexts, first, _ = _contexts(document)
    weights = line_weights(document)
    key = _key(word)
    own = contexts.get(key, frozenset())
    mates = [(other, len(own & theirs)) for other, theirs in contexts.items()
             if other != key and _kind(other) == _kind(key) and weights.get(other, 0.0) > 0.0 and own & theirs]
    return sorted(mates, key=lambda mate: (-mate[1], first[mate[0]]))


def sort_swap(question: str, answer: str, document: str,
              pages: list[tuple[int, int]]) -> tuple[str, str] | None:
    """(the question's word swapped, its rival as the document prints it) by the module's rule, or None."""
    weights = line_weights(document)
    taken = {_key(w) for w in _WORD.findall(question) if _is_word(w)} | {stem(w) for w in content_words(answer)}
    at = _anchor(answer, question, document, pages, weights)
    said = set()
    if at is not None:
        lo, hi = _sentence(document, at)
        said = {w for _, _, w in _spans(document[lo:hi] + "\n" + _sections(document, at))}
    found = []  # (not said, strength, rarity, -order, word, rival key)
    seen = set()
    for order, word in enumerate(w for w in _WORD.findall(question) if _is_word(w)):
        key = _key(word)
        if key in seen or weights.get(key, 0.0) <= 0.0:
            continue
        seen.add(key)
        usable = [(mate, shared) for mate, shared in sort_mates(word, document) if mate not in taken]
        if usable:
            found.append((key not in said, usable[0][1], weights[key], -order, word, usable[0][0]))
    if not found:
        return None
    best = max(found, key=lambda f: f[:4])
    return best[4], _contexts(document)[2][best[5]]


def sort_question(question: str, answer: str, document: str, pages: list[tuple[int, int]]) -> str | None:
    """``question`` with its word swapped for its rival of the same sort (``sort_swap``), or None."""
    swap = sort_swap(question, answer, document, pages)
    if swap is None:
        return None
    word, rival = swap
    swapped = re.sub(rf"(?<![\w.+-]){re.escape(word)}(?![\w+-]|\.\w)", lambda _: rival, question)
    return None if swapped == question else swapped
