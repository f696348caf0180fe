"""Pages of the read documents and the pages an answer cites, for the citation chips and the page viewer.

Texts carry a marker line before each PDF page (``documents.pdf`` writes them with the engine's
``page_marker``; ``page_markers`` is the one parser, the answer's sources use it too) and ``=== name ===`` headers per
file (``documents.combine``). A page's marker holds the number the book prints on it, ``[page 37]`` (its PDF page
label, else the number its running header or footer carried), so the model, the sources and the chips all say
"p. 37"; a page with no printed number in a book that has them is ``[pdf page 4]``; a PDF without printed numbers
has ``[page N]`` in PDF order. The PDF sequence of a page is its place among its file's markers.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from engine.types import page_markers

FILE_HEADER = re.compile(r"^=== (.+) ===$", re.MULTILINE)
PART_HEADER = re.compile(r"^(.*) · PDF pages (\d+)–(\d+)$")  # the file header of a page range (``file_header``)
# "(p. 12)", "p. 12", "pp. 3", "[page 12]", "page 12", "p. xii" in an answer
_CITATION = re.compile(r"(?:\bpp?\.\s*|\[page\s+|\bpage\s+)(\d{1,5}|[ivxlc]{1,8})\b", re.IGNORECASE)


class Page(NamedTuple):
    name: str  # the file it is in
    text: str
    sequence: int  # its place in the PDF (1 = the first page), whatever number it prints


def file_header(name: str, first: int, last: int) -> str:
    """The header line of a file read from PDF page ``first`` to ``last`` (a page range): the page sequence
    restarts there."""
    return f"=== {name} ===" if first == 1 else f"=== {name} · PDF pages {first}–{last} ==="


def split_pages(text: str) -> dict[str, Page]:
    """Page label -> its page; where two files share a label the first keeps it, where two pages of one file do
    the later does. A page without a printed label is keyed ``"PDF 4"``."""
    pages: dict[str, Page] = {}
    files = [(m.start(), m.group(1)) for m in FILE_HEADER.finditer(text)]
    markers = page_markers(text)
    sequence, current = 0, None
    for i, found in enumerate(markers):
        end = markers[i + 1].start if i + 1 < len(markers) else len(text)
        following_file = next((start for start, _ in files if found.end < start < end), end)
        header = next((n for start, n in reversed(files) if start < found.start), "")
        part = PART_HEADER.match(header)
        name = part.group(1) if part else header
        sequence = sequence + 1 if header == current else (int(part.group(2)) if part else 1)
        current = header
        label = found.label
        page = Page(name, text[found.end : following_file].strip(), sequence)
        # A number printed twice in one file (a cover labelled "1" before the body's page 1): the later page is the
        # body's. Across files, the first file keeps it.
        if label not in pages or pages[label].name == name:
            pages[label] = page
    return pages


def cited_pages(answer: str, known: dict[str, Page]) -> list[str]:
    """Labels of the pages the answer names that exist in the documents, in order of first mention."""
    found: list[str] = []
    for match in _CITATION.finditer(answer):
        label = match.group(1)
        label = label if label in known else label.lower()
        if label in known and label not in found:
            found.append(label)
    return found


def last_page(text: str) -> str | None:
    """Where ``text`` (a read that stopped part-way) ends: "p. 37 of bash.pdf"; None when it has no pages."""
    markers = page_markers(text)
    if not markers:
        return None
    found = markers[-1]
    label = found.label
    names = [m.group(1) for m in FILE_HEADER.finditer(text, 0, found.start)]
    return f"{chip(label)} of {names[-1]}" if names else chip(label)


def chip(label: str) -> str:
    """How a page is named on a chip: "p. 37", or "PDF p. 4" for a page without a printed number."""
    return f"PDF p. {label[4:]}" if label.startswith("PDF ") else f"p. {label}"
