"""Clean the text of PDF pages: running headers/footers out, words broken at line ends joined.

Pure text functions (no PDF library), so the rules apply alike to every extractor and are
tested on plain strings as well as real books.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from typing import Sequence

# PDFium writes U+FFFE where a word was broken with a hyphen at the end of a line, and removes
# the line break itself ("respec\ufffetively"); other extractors keep "respec-\ntively".
PDFIUM_LINE_HYPHEN = "\ufffe"

# Word processors print a break inside a word as U+00AD (soft hyphen): never part of the word.
SOFT_HYPHEN = "\u00ad"

EDGE_LINES = 2  # lines at the top and at the bottom of a page that may be a header or footer
_MIN_REPEATS = 3  # a header seen on fewer pages than this is indistinguishable from body text
_MIN_DENSITY = 0.4  # share of the pages within its span: 0.5 for headers on every other page
_MIN_VARIETY = 0.5  # share of distinct lines beside a running line, inward
_MAX_HEADER_CHARS = 160

# "73" and "73 / 233" (page / pages); not "22.34" or "3.7.3", section and version numbers stay.
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\s*/\s*\d+)?(?![\w.]|\.\d)")
_ROMAN = re.compile(r"m{0,3}(?:cm|cd|d?c{0,3})(?:xc|xl|l?x{0,3})(?:ix|iv|v?i{0,3})")
# A page number opens or closes a header line; "9.5." at the start is a section number, not one.
_LEADING_NUMBER = re.compile(r"^(\d{1,4})(?![\d.])")
_TRAILING_NUMBER = re.compile(r"(?<![\d.])(\d{1,4})(?:\s*/\s*\d+)?$")

# Words a compound begins with far more often than a hyphenated syllable does: at a line break
# "well-" + "known" keeps its hyphen unless the book itself writes the word without one.
_COMPOUND_HEADS = frozenset(
    "all half ill non self well cross multi semi quasi anti "
    "one two three four five six seven eight nine ten high low long short".split()
)  # fmt: skip
_BROKEN_WORD = re.compile(
    # Letters on both sides of the break; the lookbehind starts matches at word starts only
    # (from every letter, each attempt would rescan the rest of the word).
    rf"(?<![^\W\d_])([^\W\d_]+)(?:{PDFIUM_LINE_HYPHEN}|-\n|{SOFT_HYPHEN}\n?)([^\W\d_]+)"
)
_NAME_CHARS = "-_/.@"  # next to a broken word, these make it a package, file or host name
_NAME_AFTER = re.compile(r"[-_/@\d]|\.\w")
_WORD = re.compile(r"[^\W\d_]+(?:-[^\W\d_]+)*")


def clean_pages(pages: Sequence[str]) -> list[str]:
    """Return each page's text without running headers/footers and with line-end hyphenation undone.

    Args:
        pages: raw text of every page of one document, in order (line breaks ``\\n`` or ``\\r\\n``).
    """
    lines = [[line.strip() for line in _split_lines(page) if line.strip()] for page in pages]
    running = running_lines(lines)
    kept = ["\n".join(line for index, line in enumerate(page) if index not in running[number])
            for number, page in enumerate(lines)]
    vocabulary = _vocabulary(kept)
    return [dehyphenate(page, vocabulary) for page in kept]


def running_lines(pages: Sequence[Sequence[str]]) -> list[set[int]]:
    """For each page, the indices of its lines that are running headers or footers.

    A line at the top or bottom ``EDGE_LINES`` of a page is a running line when either
    - the same line, numbers ignored ("Debian Reference 13 / 233", "xx", "Chapter 9. Files"),
      sits at the same edge of at least 3 pages and of 40% of the pages between its first and
      last appearance (a book title on every page, a chapter title over its chapter); an
      all-capitals line counts by its first two words, for LaTeX's "CHAPTER 7. BASICS OF THE
      DEBIAN PACKAGE… 7.5. WHAT IS A CONFFILE?" that names the section as well; and the lines
      beside it, towards the body, differ from page to page (else it is repeated text); or
    - it carries the printed page number: a number at its start or end that follows the page
      index at the offset most of the document agrees on ("9.5. Cron jobs 87" on page 97).
    """
    edges = [_edge_indices(len(page)) for page in pages]
    # (side, key) -> (page number, the line next to it towards the body) for each page it is on
    seen: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for number, (page, (top, bottom)) in enumerate(zip(pages, edges)):
        for side, indices, inward in (("top", top, 1), ("bottom", bottom, -1)):
            for index in indices:
                if len(page[index]) > _MAX_HEADER_CHARS:
                    continue
                neighbour = page[index + inward] if 0 <= index + inward < len(page) else ""
                for key in _keys(page[index]):
                    if not seen[side, key] or seen[side, key][-1][0] != number:
                        seen[side, key].append((number, neighbour))
    repeated = {side_key for side_key, found in seen.items() if _is_running(found)}
    offsets = _page_number_offsets(pages, edges)

    running: list[set[int]] = []
    for number, (page, (top, bottom)) in enumerate(zip(pages, edges)):
        candidates = [index for index in dict.fromkeys((*top, *bottom))
                      if len(page[index]) <= _MAX_HEADER_CHARS]
        found = {index for index in candidates
                 if any((("top" if index in top else "bottom"), key) in repeated for key in _keys(page[index]))}
        # The printed number is on one line, the one nearest the edge; a footnote mark or
        # "Chapter 1" on printed page 1 carries the same number by chance.
        numbered = [index for index in candidates
                    if any(number - value in offsets for value in _edge_numbers(page[index]))]
        if numbered and not found.intersection(numbered):
            found.add(min(numbered, key=lambda index: min(index, len(page) - 1 - index)))
        running.append(found)
    return running


def printed_numbers(pages: Sequence[str]) -> list[int | None]:
    """The number each page prints in its running header or footer (before ``clean_pages`` strips it), where the
    document's numbering finds one: a number at the start or end of an edge line at the offset from the page index
    that the most pages agree on (front matter in roman numerals gets None)."""
    lines = [[line.strip() for line in _split_lines(page) if line.strip()] for page in pages]
    edges = [_edge_indices(len(page)) for page in lines]
    votes = _page_number_votes(lines, edges)
    numbers: list[int | None] = []
    for number, (page, (top, bottom)) in enumerate(zip(lines, edges)):
        values = {value for index in (*top, *bottom) if len(page[index]) <= _MAX_HEADER_CHARS
                  for value in _edge_numbers(page[index]) if number - value in votes}
        numbers.append(max(values, key=lambda value: votes[number - value]) if values else None)
    return numbers


def dehyphenate(text: str, vocabulary: Counter[str] | None = None) -> str:
    """Join words broken across a line end ("exam-\\nple" -> "example"), keep real compounds.

    The book's own words decide first: the hyphen stays when the book writes the hyphenated
    word more often than the joined one ("well-known"), and goes when it writes the joined word
    ("example"). For words it writes neither way, the hyphen stays when the second part starts
    with a capital ("Anti-\\nAmerican"), when the first part is a usual compound head ("self-",
    "well-", "non-"), or when both parts are words of the book ("time-\\nconsuming"); otherwise
    the parts are joined (TeX and word processors hyphenate far more often than they break a
    compound at its hyphen). Names keep it too ("fonts-crosextra-\\ncarlito"). Either way the
    word ends up whole on one line.

    Args:
        text: one page.
        vocabulary: lowercase word counts of the whole document (``None``: this text's own).
    """
    vocabulary = _vocabulary([text]) if vocabulary is None else vocabulary

    def join(match: re.Match[str]) -> str:
        head, tail = match.group(1), match.group(2)
        before, after = text[match.start() - 1 : match.start()], text[match.end() : match.end() + 2]
        # "fonts-crosextra-\ncarlito", "kfreebsd-\namd64", "debian-\npolicy.html": names, never
        # hyphenated by TeX; a full stop after the word ends a sentence unless a letter follows.
        is_name = (before != "" and before in _NAME_CHARS) or bool(_NAME_AFTER.match(after))
        if SOFT_HYPHEN not in match.group(0) and (is_name or _keeps_hyphen(head, tail, vocabulary)):
            return f"{head}-{tail}"
        return head + tail

    text = _BROKEN_WORD.sub(join, text)
    # A marker not between letters: print the hyphen; a soft hyphen is invisible anywhere.
    return text.replace(PDFIUM_LINE_HYPHEN, "-").replace(SOFT_HYPHEN, "")


def _keeps_hyphen(head: str, tail: str, vocabulary: Counter[str]) -> bool:
    hyphenated, joined = f"{head}-{tail}".lower(), f"{head}{tail}".lower()
    if vocabulary[hyphenated] > vocabulary[joined]:
        return True
    if vocabulary[joined]:
        return False
    if tail[0].isupper() or head.lower() in _COMPOUND_HEADS:
        return True
    return vocabulary[head.lower()] > 0 and vocabulary[tail.lower()] > 0


def _vocabulary(pages: Sequence[str]) -> Counter[str]:
    # Words as the book prints them within lines; broken words are not counted as either form.
    counts: Counter[str] = Counter()
    for page in pages:
        if PDFIUM_LINE_HYPHEN in page or SOFT_HYPHEN in page or "-\n" in page:
            page = _BROKEN_WORD.sub(" ", page)
        words = _WORD.findall(page.lower())
        counts.update(words)
        # "debian-faq" also shows that "faq" is a word of the book.
        counts.update(part for word in words if "-" in word for part in word.split("-"))
    return counts


def _split_lines(page: str) -> list[str]:
    return page.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _edge_indices(num_lines: int) -> tuple[range, range]:
    top = range(min(EDGE_LINES, num_lines))
    bottom = range(max(num_lines - EDGE_LINES, len(top)), num_lines)
    return top, bottom


def _keys(line: str) -> tuple[str, ...]:
    # Numbers, arabic or roman ("xx" in the front matter), are what changes from page to page.
    words = ["#" if _ROMAN.fullmatch(word) and word else word for word in _NUMBER.sub("#", line.lower()).split()]
    if len(words) > 3 and line.isupper():
        return " ".join(words), "CAPS " + re.sub(r"\d+", "#", " ".join(words[:2]))
    return (" ".join(words),)


def _is_running(found: list[tuple[int, str]]) -> bool:
    span = found[-1][0] - found[0][0] + 1
    if len(found) < _MIN_REPEATS or len(found) < _MIN_DENSITY * span:
        return False
    # Beside a header the body changes from page to page; beside a line of repeated filler
    # text (the same page printed again), it does not.
    return len({neighbour for _, neighbour in found}) >= _MIN_VARIETY * len(found)


def _edge_numbers(line: str) -> set[int]:
    return {int(match.group(1)) for pattern in (_LEADING_NUMBER, _TRAILING_NUMBER)
            if (match := pattern.search(line))}


def _page_number_offsets(pages: Sequence[Sequence[str]], edges: list[tuple[range, range]]) -> set[int]:
    """Offsets ``page index - printed number`` shared by enough pages to be the numbering."""
    return set(_page_number_votes(pages, edges))


def _page_number_votes(pages: Sequence[Sequence[str]], edges: list[tuple[range, range]]) -> Counter[int]:
    """Those offsets, each with the number of pages that agree on it."""
    votes: Counter[int] = Counter()
    for number, (page, (top, bottom)) in enumerate(zip(pages, edges)):
        printed = set().union(*(_edge_numbers(page[index]) for index in (*top, *bottom)))
        votes.update(number - value for value in printed)
    needed = max(_MIN_REPEATS, len(pages) // 4)
    return Counter({offset: count for offset, count in votes.items() if count >= needed})
