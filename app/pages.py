"""Pages of the read documents and the pages an answer cites, for the citation chips and the page viewer.

Where each file and page lies is stored when the app joins the documents (``join``, ``app.pieces.range_text``):
a ``Joined`` text carries its ``Layout``, and every boundary is read from there, never from the text, so a document
whose own lines read ``=== evil ===`` or ``[page 999]`` makes no file or page. A PDF's pages are the marker lines its
reader wrote before each page (``engine.types.page_marker``): ``[page 37]`` holds the number the book prints on it
(its PDF page label, else the number its running header or footer carried), so the model, the sources and the chips
all say "p. 37"; a page with no printed number in a book that has them is ``[pdf page 4]``; a PDF without printed
numbers has ``[page N]`` in PDF order. The PDF sequence of a page is its place among its file's pages. Only a PDF has
pages, and only when its text holds exactly one marker line per page (else its own text forged one: it has none).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import NamedTuple

from app.documents import Document
from engine.types import PageMarker, page_markers

logger = logging.getLogger(__name__)

# "(p. 12)", "p. 12", "pp. 3", "[page 12]", "page 12", "p. xii" in an answer
_CITATION = re.compile(r"(?:\bpp?\.\s*|\[page\s+|\bpage\s+)(\d{1,5}|[ivxlc]{1,8})\b", re.IGNORECASE)


class Page(NamedTuple):
    name: str  # the file it is in
    text: str
    sequence: int  # its place in the PDF (1 = the first page), whatever number it prints


class FilePart(NamedTuple):
    """One file's text in a joined text (after its header line)."""

    name: str
    start: int
    end: int


class PagePart(NamedTuple):
    """One page in a joined text: its marker line from ``start``, its text from ``body`` to ``end``."""

    label: str  # "37", "xii", "PDF 4" (no printed number)
    file: int  # its file's index in ``Layout.files``
    start: int
    body: int
    end: int
    sequence: int


class Layout(NamedTuple):
    """Where the files and pages of a joined text lie, as the app wrote them."""

    files: tuple[FilePart, ...] = ()
    pages: tuple[PagePart, ...] = ()

    def clip(self, length: int) -> Layout:
        """The layout of the first ``length`` characters (a read truncated to fit): a page whose marker is cut is
        not one."""
        files = tuple(f._replace(end=min(f.end, length)) for f in self.files if f.start <= length)
        pages = tuple(p._replace(end=min(p.end, length)) for p in self.pages if p.body <= length)
        return Layout(files, pages)


class Joined(str):
    """A text the app joined from documents, with its ``layout`` (equal to, and used as, the plain text)."""

    layout: Layout

    def __new__(cls, text: str, layout: Layout = Layout()):
        joined = super().__new__(cls, text)
        joined.layout = layout
        return joined

    def __reduce__(self):
        return Joined, (str(self), self.layout)


def document_pages(doc: Document) -> list[tuple[str, int, int, int]]:
    """``(label, marker start, text start, end)`` of each page of ``doc`` in its own text: a PDF's reader-written
    markers; none for other kinds (a ``[page 3]`` line in a text file is its text), and none for a PDF whose text
    holds more marker lines than it has pages (its own text forged some, and which are the reader's is unknown)."""
    if doc.kind != "pdf" or not doc.pages:
        return []
    markers = page_markers(doc.text)
    if len(markers) != doc.pages or markers[0].start != 0:
        logger.warning("%s: %d page marker lines for %d pages; its pages are not told apart", doc.name,
                       len(markers), doc.pages)
        return []
    ends = [m.start for m in markers[1:]] + [len(doc.text)]
    return [(m.label, m.start, m.end, end) for m, end in zip(markers, ends)]


def header(name: str, first: int = 1, last: int | None = None) -> str:
    """The header line of a file, read whole or from PDF page ``first`` to ``last`` (a page range: the page sequence
    restarts there)."""
    return f"=== {name} ===" if first == 1 else f"=== {name} · PDF pages {first}–{last} ==="


def join(documents: Sequence[Document]) -> Joined:
    """``documents.combine``'s text (each file after a ``=== <name> ===`` line), with where each file and page lies."""
    return join_parts([(doc.name, header(doc.name), doc.text, [(label, start, body, end, i + 1) for i, (label, start,
                        body, end) in enumerate(document_pages(doc))]) for doc in documents])


def join_parts(parts: Sequence[tuple[str, str, str, Sequence[tuple[str, int, int, int, int]]]]) -> Joined:
    """Joins ``(name, header line, text, pages)`` parts, each page ``(label, marker start, text start, end,
    sequence)`` in its part's text, into one text, and stores where everything lies."""
    chunks, files, pages, offset = [], [], [], 0
    for index, (name, line, text, own) in enumerate(parts):
        line += "\n"
        start = offset + len(line)
        files.append(FilePart(name, start, start + len(text)))
        pages += [PagePart(label, index, start + a, start + b, start + c, sequence) for label, a, b, c, sequence in own]
        chunks.append(line + text)
        offset = start + len(text) + 2  # "\n\n" between files
    return Joined("\n\n".join(chunks), Layout(tuple(files), tuple(pages)))


def layout_of(text: str, joined: str | None = None) -> Layout:
    """The layout of ``text``: its own (a ``Joined``), else that of ``joined`` (the text it was read from: ``text``
    is its beginning, maybe followed by a truncation note); an empty one for a text the app did not join."""
    own = getattr(text, "layout", None)
    if own is not None:
        return own
    layout = getattr(joined, "layout", None)
    if layout is None:
        return Layout()
    return layout if text == joined else layout.clip(shared_prefix(text, joined))


def tokenize(session, text: str):
    """``session.tokenize(text)`` with the pages of ``text``'s layout (``layout_of``) as the engine's page bounds, so
    the answers' sources name the pages the app joined and no line of a document's own text."""
    return session.tokenize(text, [PageMarker(page.start, page.body, page.label) for page in layout_of(text).pages])


def read_part(text: str, joined: str) -> Joined:
    """``text`` (``joined``, or the beginning of it that a truncated read holds) with its layout."""
    return text if isinstance(text, Joined) else Joined(text, layout_of(text, joined))


def shared_prefix(text: str, other: str) -> int:
    """How many first characters ``text`` and ``other`` share (binary search on C-speed ``startswith``)."""
    low, high = 0, min(len(text), len(other))
    while low < high:
        middle = (low + high + 1) // 2
        if other.startswith(text[:middle]):
            low = middle
        else:
            high = middle - 1
    return low


def split_pages(text: str, joined: str | None = None) -> dict[str, Page]:
    """Page label -> its page (``layout_of(text, joined)``); where two files share a label the first keeps it, where
    two pages of one file do the later does. A page without a printed label is keyed ``"PDF 4"``."""
    layout = layout_of(text, joined)
    pages: dict[str, Page] = {}
    for part in layout.pages:
        name = layout.files[part.file].name
        page = Page(name, text[part.body : part.end].strip(), part.sequence)
        # A number printed twice in one file (a cover labelled "1" before the body's page 1): the later page is the
        # body's. Across files, the first file keeps it.
        if part.label not in pages or pages[part.label].name == name:
            pages[part.label] = page
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


def last_page(text: str, joined: str | None = None) -> str | None:
    """Where ``text`` (a read that stopped part-way; ``layout_of(text, joined)``) ends: "p. 37 of bash.pdf"; None
    when it has no pages."""
    layout = layout_of(text, joined)
    if not layout.pages:
        return None
    found = layout.pages[-1]
    return f"{chip(found.label)} of {layout.files[found.file].name}"


def chip(label: str) -> str:
    """How a page is named on a chip: "p. 37", or "PDF p. 4" for a page without a printed number."""
    return f"PDF p. {label[4:]}" if label.startswith("PDF ") else f"p. {label}"
