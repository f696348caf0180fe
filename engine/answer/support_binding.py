"""Whether an answer's claim is bound to what the question asks: ``binding_share``.

An answer copied from a neighbouring entity ("GCC 10.3.0" asked for macOS; the page gives it under "3.1.1 The
Windows toolset") passes the signals that read how it was made: its words are on a cited page and its attention is
there. What gives it away is what its key string is said *about*: the sentence that holds it and the section
headings above that sentence. So: find the answer's own words (those not in the question) on its cited pages, and
measure how much of the question (its words the pages use) that sentence and its headings say. A right answer's
string sits in a sentence about the question's entity, or under a heading that names it; a copied neighbour's sits
in a sentence and a section about another.

Narrower than ``support_entity.entity_share`` (a window of lines either side, which often reaches the question's
entity in the next sentence or paragraph) and wider where a document states the entity once for a whole section
(its heading). Headings are a manual's numbered ones ("3.1.2 LATEX", "7.1 What is a Debian package?"); a document
without them is judged by the sentence alone.
"""

from __future__ import annotations

import bisect
import functools
import re

from .support import content_words, stem
from .support_entity import _spans, _words, line_weights

# A sentence ends at . ! ? ; or : before a capital, an opening bracket or quote, a blank line or the text's end; a
# blank line ends one too (a heading or list line without punctuation).
_SENTENCE_END = re.compile(r"[.!?;:](?=[ \t]*\n?[ \t]*[A-Z(\[‘'\"“]|\s*\n\s*\n|\s*$)|\n[ \t]*\n")
# A numbered heading on its own line: "3.1.2 LATEX", "2.5.2 How can R be installed (Windows)", "4 Installing R
# under macOS" (a one-level number only when the line is short and ends without a full stop: not a footnote).
_HEADING = re.compile(r"^(\d+(?:\.\d+)+)\.?[ \t]+(\S[^\n]{0,80})$|^(\d+)[ \t]+([A-Z][^\n]{0,48}[^\n.:,;])$", re.M)


@functools.lru_cache(maxsize=4)  # per document: its sentences and headings are found once, not per answer
def _layout(document: str) -> tuple[list[int], list[int], list[tuple[str, str]]]:
    """(sentence start offsets, heading offsets, (number, line) per heading) of ``document``."""
    starts = [0] + [m.end() for m in _SENTENCE_END.finditer(document)]
    offsets, headings = [], []
    for m in _HEADING.finditer(document):
        offsets.append(m.start())
        headings.append((m.group(1) or m.group(3), m.group(0)))
    return starts, offsets, headings


def _sections(document: str, at: int) -> str:
    """The headings ``at`` lies under: the nearest numbered heading before it and its parents ("3.1.2" under
    "3.1" under "3"), joined."""
    _, offsets, headings = _layout(document)
    i = bisect.bisect_right(offsets, at) - 1
    if i < 0:
        return ""
    number, line = headings[i]
    found = [line]
    wanted = number.rsplit(".", 1)[0] if "." in number else None
    for j in range(i - 1, -1, -1):
        if wanted is None:
            break
        if headings[j][0] == wanted:
            found.append(headings[j][1])
            wanted = wanted.rsplit(".", 1)[0] if "." in wanted else None
    return "\n".join(found)


def _sentence(document: str, at: int) -> tuple[int, int]:
    """(start, end) of the sentence of ``document`` that holds offset ``at``."""
    starts, _, _ = _layout(document)
    i = bisect.bisect_right(starts, at) - 1
    return starts[i], starts[i + 1] if i + 1 < len(starts) else len(document)


def binding_share(question: str, answer: str, document: str, pages: list[tuple[int, int]],
                  headings: bool = True) -> float | None:
    """How much of the question (its content words' stems that the cited pages use, each alike, less any word on
    every line of ``document``) the sentence holding each of the answer's own words on its cited ``pages`` ((start,
    end) offsets in ``document``) says, with the headings above it (``headings``), in [0, 1]: per own word, its best
    occurrence; averaged over those words, each weighted by its rarity (``line_weights``).

    0 when none of the answer's own words is on those pages; None when it has no word of its own, the question no
    weighted word the pages use, or there are no pages."""
    weights = line_weights(document)
    texts = [(start, document[start:end]) for start, end in pages]
    on_pages = {w for _, text in texts for _, w in _words(text)}
    asked = {w for _, w in _words(question) if weights.get(w, 0.0) > 0.0 and w in on_pages}
    own = {stem(w) for w in content_words(answer) - content_words(question)} - asked
    if not own or not asked or not pages:
        return None
    best: dict[str, float] = {}  # per own word found on a page: the most of the question said about it
    for offset, text in texts:
        for start, _, word in _spans(text):
            if word in own:
                lo, hi = _sentence(document, offset + start)
                said = document[lo:hi] + ("\n" + _sections(document, offset + start) if headings else "")
                near = {w for _, w in _words(said)}
                best[word] = max(best.get(word, 0.0), len(asked & near) / len(asked))
    if not best:
        return 0.0
    weight = {word: weights.get(word, 0.0) for word in best}
    if sum(weight.values()) <= 0.0:
        return max(best.values())
    return sum(best[word] * weight[word] for word in best) / sum(weight.values())
