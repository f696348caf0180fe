"""Whether an answer's claim was read about what the question asks: ``entity_share``.

An invented answer that copies a real string from a neighbouring page passes the other support signals: its words
are on a page it cites (``grounded_share``) and its attention is on the pages (``document_share``). What gives it
away is *where* the string sits: "R 4.1.3 was the last version to support 32-bit Windows" answers a question about
32-bit macOS with Windows' version. So: find the answer's own words (those not in the question) on its cited pages,
and measure how much of the question is said within a few lines of them. A copied neighbour's string sits among
another entity's words; a right answer sits among the question's.

The question's words counted are those its cited pages use (a paraphrase the pages never use says nothing about
where the claim was read; ``asked_share`` judges words the document never uses), each alike, less any word on every
line of the document ("R" in the R FAQ). The answer's own words are weighted by how rare they are in the document
(inverse line frequency): a rare one ("Callaway", "4.1.3") says where the claim was read, a common one does not.
The window and these choices were settled on the two manuals the other thresholds were fitted on, before any answer
on the held-out manuals was generated (``docs/benchmarks/support-held-out.md``).
"""

from __future__ import annotations

import bisect
import functools
import math

from .support import _STOPWORDS, _WORD, content_words, stem

WINDOW = 200  # characters either side of a claim word: about three lines of a manual page (a term and its definition)


def _words(text: str) -> list[tuple[int, str]]:
    """(offset, stem) of each content word of ``text``, in order (``content_words``' words, stemmed)."""
    return [(offset, word) for offset, _, word in _spans(text)]


def _spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, stem) of each content word of ``text``, in order."""
    spans = []
    for match in _WORD.finditer(text):
        word = match.group().lower().strip("./-") or match.group()
        if word not in _STOPWORDS:
            spans.append((match.start(), match.end(), stem(word)))
    return spans


@functools.lru_cache(maxsize=4)  # per document: its lines are counted once, not once per answer
def line_weights(document: str) -> dict[str, float]:
    """{stem: log(lines / lines holding it)} over ``document``'s non-empty lines (a stem on every line weighs 0)."""
    lines = [line for line in document.splitlines() if line.strip()]
    counts: dict[str, int] = {}
    for line in lines:
        for word in {w for _, w in _words(line)}:
            counts[word] = counts.get(word, 0) + 1
    return {word: math.log(len(lines) / count) for word, count in counts.items()}


def entity_share(question: str, answer: str, pages: list[str], document: str,
                 window: int = WINDOW) -> float | None:
    """How much of the question (its content words' stems, weighted by ``line_weights``) is said within ``window``
    characters of the answer's own words on ``pages`` (the cited pages' texts), in [0, 1]: per own word found
    there, its best occurrence; averaged over those words, each weighted by its own rarity.

    0 when none of the answer's own words is on those pages; None when it has no word of its own, the question no
    weighted word the document uses, or there are no pages."""
    weights = line_weights(document)
    on_pages = {w for page in pages for _, w in _words(page)}
    # The question's words its cited pages use (a paraphrase the pages never use says nothing about where), each
    # counted alike: a missing platform name ("macOS" beside Windows' version) weighs as much as any word.
    asked = {w: 1.0 for _, w in _words(question) if weights.get(w, 0.0) > 0.0 and w in on_pages}
    own = {stem(w) for w in content_words(answer) - content_words(question)} - set(asked)
    if not own or not asked or not pages:
        return None
    total = sum(asked.values())
    best: dict[str, float] = {}  # per own word found on a page: the most of the question said around it
    for page in pages:
        words = _spans(page)
        offsets = [start for start, _, _ in words]
        for start, end, word in words:
            if word in own:
                near = {w for _, _, w in words[bisect.bisect_left(offsets, start - window):
                                               bisect.bisect_right(offsets, end + window)]}
                best[word] = max(best.get(word, 0.0), sum(v for w, v in asked.items() if w in near) / total)
    # A rare claim word ("Callaway") says where the claim was read; a common one ("provided") is near everything.
    weight = {word: weights.get(word, 0.0) for word in best}
    if not best:
        return 0.0
    if sum(weight.values()) <= 0.0:
        return max(best.values())
    return sum(best[word] * weight[word] for word in best) / sum(weight.values())


def peak_entity_share(question: str, document: str, peaks: list[tuple[int, float]],
                      window: int = WINDOW) -> float | None:
    """``entity_share`` read off the answer's attention instead of its words: how much of the question (its words
    the document uses, each alike) is said within ``window`` characters of the document tokens the answer attended
    to most (``peaks``: (character offset in ``document``, attention share) each), averaged by their attention.
    An answer built from a neighbour's string looks at that string, among another entity's words. None without
    peaks or without a question word the document uses."""
    weights = line_weights(document)
    asked = {w for _, w in _words(question) if weights.get(w, 0.0) > 0.0}
    mass = sum(share for _, share in peaks)
    if not asked or not peaks or mass <= 0:
        return None
    total = 0.0
    for offset, share in peaks:
        near = {w for _, w in _words(document[max(0, offset - window):offset + window])}
        total += share * len(asked & near) / len(asked)
    return total / mass
