"""A way into a whole book: choosing which pages of a document set too large to read whole are read.

The set's pages, in order across its files, each with its printed label and where it lies in the combined text
(``documents.combine``); a page range's text (each file's header kept) and its token count, read off the one
tokenization of the whole set; the first part that fits. A file without page markers (text, EPUB, DOCX) is one
piece.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.documents import Document
from app.pages import FILE_HEADER, PART_HEADER, chip, file_header
from app.sizing import document_spans
from engine.types import DocumentTokens, page_markers


@dataclass(frozen=True)
class Piece:
    """One page (or a whole file without pages) of a document set."""

    file_index: int
    name: str
    label: str  # "37", "PDF 4" (no printed number), "" for a whole file
    start: int  # where it lies in the combined text (its marker included)
    end: int
    sequence: int = 1  # its place in its file (the PDF page)

    @property
    def title(self) -> str:
        return chip(self.label) if self.label else f"{self.name} (whole file)"


def pieces_of(documents: Sequence[Document]) -> list[Piece]:
    """The set's pages in reading order."""
    pieces = []
    for index, (doc, (start, end)) in enumerate(zip(documents, document_spans(documents))):
        markers = page_markers(doc.text)
        if not markers:
            pieces.append(Piece(index, doc.name, "", start, end))
            continue
        for i, found in enumerate(markers):
            stop = markers[i + 1].start if i + 1 < len(markers) else len(doc.text)
            label = found.label
            # The text before the first marker (rare) goes with the first page.
            first = 0 if i == 0 else found.start
            pieces.append(Piece(index, doc.name, label, start + first, start + stop, i + 1))
    return pieces


def choices(pieces: Sequence[Piece]) -> list[tuple[str, int]]:
    """Drop-down choices: each page by its printed label (and file, for a set of several), valued by its index."""
    several = len({piece.file_index for piece in pieces}) > 1
    return [(f"{piece.title} · {piece.name}" if several and piece.label else piece.title, index)
            for index, piece in enumerate(pieces)]


def range_text(text: str, pieces: Sequence[Piece], first: int, last: int) -> str:
    """The combined text of pieces ``first..last`` (inclusive): each file's header, then its chosen pages. A file
    read from a later page says which PDF pages it holds (``app.pages.file_header``), so the viewer can tell."""
    parts, chosen = [], pieces[first : last + 1]
    for file_index in dict.fromkeys(piece.file_index for piece in chosen):
        own = [piece for piece in chosen if piece.file_index == file_index]
        header = file_header(own[0].name, own[0].sequence, own[-1].sequence) if own[0].label else f"=== {own[0].name} ==="
        parts.append(f"{header}\n{text[own[0].start : own[-1].end].strip()}")
    return "\n\n".join(parts)


def range_tokens(tokens: DocumentTokens, pieces: Sequence[Piece], first: int, last: int) -> int | None:
    """Tokens pieces ``first..last`` take, read off the whole set's tokenization; None without offsets."""
    return tokens.count_between(pieces[first].start, pieces[last].end)


def first_part_that_fits(tokens: DocumentTokens, pieces: Sequence[Piece], limit: int) -> int | None:
    """The last piece of the longest run from the first that fits in ``limit`` tokens (the prompt and each file's
    header given some room); None when not even the first page fits or the tokenizer gives no offsets."""
    budget = int(limit * 0.97) - 64
    last = None
    for index in range(len(pieces)):
        count = range_tokens(tokens, pieces, 0, index)
        if count is None or count > budget:
            break
        last = index
    return last


def describe(pieces: Sequence[Piece], first: int, last: int) -> str:
    """``"p. 37 – p. 80 of bash.pdf"``."""
    start, end = pieces[first], pieces[last]
    span = start.title if first == last else f"{start.title} – {end.title}"
    names = list(dict.fromkeys(piece.name for piece in pieces[first : last + 1]))
    return f"{span} of {', '.join(names)}" if start.label else span


def parts_read(text: str, documents: Sequence[Document]) -> list[tuple[Document, int, int]]:
    """The files of a read ``text`` as it holds them (a page range holds some pages of each): per file, a
    ``Document`` of its part (its characters, its pages) and where that part lies in ``text``, so the files table
    of a reopened range shows what was read, not the whole book."""
    known = {doc.name: doc for doc in documents}
    headers = []
    for found in FILE_HEADER.finditer(text):
        part = PART_HEADER.match(found.group(1))
        name = part.group(1) if part else found.group(1)
        if name in known:
            headers.append((found, known[name]))
    parts = []
    for i, (found, doc) in enumerate(headers):
        start = min(found.end() + 1, len(text))
        end = headers[i + 1][0].start() if i + 1 < len(headers) else len(text)
        own = text[start:end].rstrip("\n")
        pages = None if doc.pages is None else len(page_markers(own))
        parts.append((Document(doc.name, doc.kind, own, pages), start, start + len(own)))
    return parts
