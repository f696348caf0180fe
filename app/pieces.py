"""A way into a whole book: choosing which pages of a document set too large to read whole are read.

The set's pages, in order across its files, each with its printed label and where it lies in the joined text
(``app.pages.join``); a page range's text (each file's header kept, its layout stored: ``app.pages.Joined``) and its
token count, read off the one tokenization of the whole set; the first part that fits. A file without pages (text,
EPUB, DOCX) is one piece. A saved text is joined again from its documents (``rejoin``), never parsed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.documents import Document
from app.pages import Joined, chip, document_pages, header, join, join_parts, layout_of, shared_prefix
from app.sizing import document_spans
from engine.types import DocumentTokens


@dataclass(frozen=True)
class Piece:
    """One page (or a whole file without pages) of a document set."""

    file_index: int
    name: str
    label: str  # "37", "PDF 4" (no printed number), "" for a whole file
    start: int  # where it lies in the combined text (its marker included)
    end: int
    sequence: int = 1  # its place in its file (the PDF page)
    body: int | None = None  # where its text starts, after its marker line (None: a whole file)

    @property
    def title(self) -> str:
        return chip(self.label) if self.label else f"{self.name} (whole file)"


def pieces_of(documents: Sequence[Document]) -> list[Piece]:
    """The set's pages in reading order."""
    pieces = []
    for index, (doc, (start, end)) in enumerate(zip(documents, document_spans(documents))):
        pages = document_pages(doc)
        if not pages:
            pieces.append(Piece(index, doc.name, "", start, end))
            continue
        for i, (label, _, body, stop) in enumerate(pages):
            pieces.append(Piece(index, doc.name, label, start + _first(pages, i), start + stop, i + 1, start + body))
    return pieces


def _first(pages, i: int) -> int:
    """Where piece ``i`` of a file starts in its text: its marker, or 0 for the first (the text before it, rare, goes
    with the first page)."""
    return 0 if i == 0 else pages[i][1]


def choices(pieces: Sequence[Piece]) -> list[tuple[str, int]]:
    """Drop-down choices: each page by its printed label (and file, for a set of several), valued by its index."""
    several = len({piece.file_index for piece in pieces}) > 1
    return [(f"{piece.title} · {piece.name}" if several and piece.label else piece.title, index)
            for index, piece in enumerate(pieces)]


def range_text(text: str, pieces: Sequence[Piece], first: int, last: int) -> Joined:
    """The joined text of pieces ``first..last`` (inclusive): each file's header, then its chosen pages. A file
    read from a later page says which PDF pages it holds (``app.pages.header``), so the viewer can tell."""
    parts, chosen = [], pieces[first : last + 1]
    for file_index in dict.fromkeys(piece.file_index for piece in chosen):
        own = [piece for piece in chosen if piece.file_index == file_index]
        raw = text[own[0].start : own[-1].end]
        lead, body = len(raw) - len(raw.lstrip()), raw.strip()
        base = own[0].start + lead  # where the part's stripped text starts in ``text``
        pages = [(p.label, max(p.start - base, 0), p.body - base, min(p.end - base, len(body)), p.sequence)
                 for p in own if p.label and p.body is not None and p.body - base <= len(body)]
        line = header(own[0].name, own[0].sequence, own[-1].sequence) if own[0].label else header(own[0].name)
        parts.append((own[0].name, line, body, pages))
    return join_parts(parts)


def range_tokens(tokens: DocumentTokens, pieces: Sequence[Piece], first: int, last: int) -> int | None:
    """Tokens pieces ``first..last`` take, read off the whole set's tokenization; None without offsets."""
    return tokens.count_between(pieces[first].start, pieces[last].end)


def first_part_that_fits(tokens: DocumentTokens, pieces: Sequence[Piece], limit: int) -> int | None:
    """The last piece of the longest stretch from the first that fits in ``limit`` tokens (the prompt and each file's
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


def rejoin(text: str, documents: Sequence[Document]) -> Joined:
    """A saved ``text`` read from ``documents`` with its layout again: the whole set, a page range of it, or the
    beginning of either (truncated to fit), matched against what joining them writes, not parsed. What matches
    nothing has no files or pages."""
    whole = join(documents)
    if _note_after(text, shared_prefix(text, whole)):
        return Joined(text, layout_of(text, whole))
    pieces, at, parts = pieces_of(documents), 0, []
    while at < len(text) and (found := _part_at(text, at, whole, pieces)) is not None:
        part, at = found
        parts.append(part)
        at += 2  # "\n\n" before the next file's header
    return Joined(text, layout_of(text, join_parts(parts)))


def _note_after(text: str, at: int) -> bool:
    """Whether ``text`` ends at ``at`` or with one short bracketed line there: the note the engine writes after a
    read truncated to fit ("[... truncated to fit ...]")."""
    rest = text[at:]
    return not rest or (len(rest) <= 64 and rest.startswith("\n[") and rest.endswith("]") and "\n" not in rest[1:])


def _part_at(text: str, at: int, whole: Joined, pieces: Sequence[Piece]):
    """The file part of a range text whose header line starts at ``at``, as ``join_parts`` takes it, and where it
    ends; None when no file's part is there."""
    end = text.find("\n", at, at + 4096)
    line = text[at:end] if end >= 0 else ""
    start = at + len(line) + 1
    for file_index in dict.fromkeys(piece.file_index for piece in pieces):
        own = [piece for piece in pieces if piece.file_index == file_index]
        for a, b in _spans(line, own):
            base = own[a].start
            while base < own[b].end and whole[base].isspace():  # ``range_text`` strips the part
                base += 1
            same = shared_prefix(text[start:], whole[base : own[b].end])
            for k in range(b, a - 1, -1):  # the longest stretch of pages that is there whole
                length = _stripped_end(whole, base, own[k].end) - base
                if length <= same and (start + length == len(text) or text.startswith("\n\n=== ", start + length)):
                    return _part(whole, own, a, k, length, line), start + length
            if _note_after(text, start + same):  # truncated to fit inside this file
                return _part(whole, own, a, b, same, line), start + same
    return None


def _stripped_end(text: str, start: int, end: int) -> int:
    while end > start and text[end - 1].isspace():
        end -= 1
    return end


def _part(whole: Joined, own: Sequence[Piece], first: int, last: int, length: int, line: str):
    """``join_parts``' input for pieces ``first..last`` of one file under header ``line``, its text cut at
    ``length``."""
    part = range_text(whole, own, first, last)
    f = part.layout.files[0]
    pages = [(p.label, p.start - f.start, p.body - f.start, min(p.end - f.start, length), p.sequence)
             for p in part.layout.pages if p.body - f.start <= length]
    return own[first].name, line, part[f.start : f.start + length], pages


def _spans(line: str, own: Sequence[Piece]) -> list[tuple[int, int]]:
    """The (first, last) pieces of a file whose header is ``line``: a later first page names both; a header read
    from the first page names neither last (every one is a candidate, the longest first)."""
    if line == header(own[0].name):
        return [(0, len(own) - 1)]
    prefix = f"=== {own[0].name} · PDF pages "
    if not own[0].label or not line.startswith(prefix):
        return []
    by_sequence = {piece.sequence: index for index, piece in enumerate(own)}
    return [(a, b) for a in range(len(own)) for b in [by_sequence.get(int(n)) for n in _last(line, prefix)]
            if b is not None and b >= a and line == header(own[0].name, own[a].sequence, own[b].sequence)]


def _last(line: str, prefix: str) -> list[str]:
    """The last page a range header names, as written (``header``): "… · PDF pages 9–13 ===" -> ["13"]."""
    rest = line[len(prefix) :].removesuffix(" ===")
    last = rest.rpartition("–")[2]
    return [last] if last.isdigit() else []


def parts_read(text: str, documents: Sequence[Document]) -> list[tuple[Document, int, int]]:
    """The files of a read ``text`` as it holds them (a page range holds some pages of each): per file, a
    ``Document`` of its part (its characters, its pages) and where that part lies in ``text``, so the files table
    of a reopened range shows what was read, not the whole book. From the layout stored when ``text`` was joined
    (``rejoin`` for a saved one)."""
    layout = layout_of(text) if isinstance(text, Joined) else rejoin(text, documents).layout
    known = {doc.name: doc for doc in documents}
    parts = []
    for index, part in enumerate(layout.files):
        doc = known.get(part.name)
        if doc is None:
            continue
        own = text[part.start : part.end].rstrip("\n")
        pages = None if doc.pages is None else sum(1 for page in layout.pages if page.file == index)
        parts.append((Document(doc.name, doc.kind, own, pages), part.start, part.start + len(own)))
    return parts
