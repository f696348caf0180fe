"""Pages of the read documents and the pages an answer cites, for the citation chips and the page viewer.

Texts carry ``[page N]`` markers (PDFs) and ``=== name ===`` headers per file (``documents.combine``).
"""

from __future__ import annotations

import re

_MARKER = re.compile(r"^\[page (\d+)\]$", re.MULTILINE)
_FILE = re.compile(r"^=== (.+) ===$", re.MULTILINE)
# "(p. 12)", "p. 12", "pp. 3", "[page 12]", "page 12" in an answer
_CITATION = re.compile(r"(?:\bpp?\.\s*|\[page\s+|\bpage\s+)(\d{1,5})\b", re.IGNORECASE)


def split_pages(text: str) -> dict[int, tuple[str, str]]:
    """Page number -> (file name, page text); where two files share a number, the first keeps it."""
    pages: dict[int, tuple[str, str]] = {}
    files = [(m.start(), m.group(1)) for m in _FILE.finditer(text)]
    markers = list(_MARKER.finditer(text))
    for i, marker in enumerate(markers):
        end = markers[i + 1].start() if i + 1 < len(markers) else len(text)
        following_file = next((start for start, _ in files if marker.end() < start < end), end)
        name = next((n for start, n in reversed(files) if start < marker.start()), "")
        pages.setdefault(int(marker.group(1)), (name, text[marker.end() : following_file].strip()))
    return pages


def cited_pages(answer: str, known: dict[int, tuple[str, str]]) -> list[int]:
    """Pages the answer names that exist in the documents, in order of first mention."""
    found: list[int] = []
    for match in _CITATION.finditer(answer):
        page = int(match.group(1))
        if page in known and page not in found:
            found.append(page)
    return found
