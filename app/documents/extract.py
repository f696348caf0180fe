"""One file's text, as the reading child makes it: every parse of the file's bytes happens here, and nothing here
imports the engine (and torch), so the child starts in a second and its memory is the file's.

The text comes back normalised and cut at ``MAX_TEXT_CHARS``; a PDF's comes back per page, with each page's
label, and ``app.documents.finish`` puts the engine's page markers between them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from app.documents.archive import check_zip
from app.documents.document import DocumentError
from app.documents.ebook import read_docx, read_epub
from app.documents.limits import MAX_TEXT_CHARS
from app.documents.markup import html_to_text
from app.documents.pdf import read_pdf
from app.documents.text import decode_text, normalise, refuse_binary

logger = logging.getLogger(__name__)

SUPPORTED_SUFFIXES = (".pdf", ".txt", ".md", ".markdown", ".html", ".htm", ".epub", ".docx")

_KINDS = {
    ".pdf": "pdf",
    ".txt": "txt",
    ".md": "md",
    ".markdown": "md",
    ".html": "html",
    ".htm": "html",
    ".epub": "epub",
    ".docx": "docx",
}


@dataclass(frozen=True)
class Extracted:
    """A file's text before it is a :class:`~app.documents.document.Document`.

    Attributes:
        name: the file name shown to the user.
        kind: as ``Document.kind``.
        text: the normalised text (empty for a PDF, whose text is in ``pages``).
        pages: a PDF's cleaned, normalised page texts, ``None`` for other kinds.
        labels: each PDF page's printed label (``None`` where it prints none).
        cut_from: the characters the file held when its text was cut at ``MAX_TEXT_CHARS``, else ``None``.
    """

    name: str
    kind: str
    text: str = ""
    pages: tuple[str, ...] | None = None
    labels: tuple[str | None, ...] | None = None
    cut_from: int | None = None


def extract(path: Path, name: str) -> Extracted:
    """Read one file (its suffix, or the shown name's, picks the reader) into an :class:`Extracted`.

    Raises:
        DocumentError: unsupported type, missing, empty, too big unpacked, encrypted, scanned, binary or damaged.
    """
    # The display name carries the real extension when uploads are stored under temp names.
    suffixes = (Path(name).suffix.lower(), path.suffix.lower())
    suffix = next((s for s in suffixes if s in _KINDS), suffixes[0] or suffixes[1])
    kind = _KINDS.get(suffix)
    if kind is None:
        raise DocumentError(
            f"{name}: unsupported file type {suffix or '(no extension)'!r}. "
            f"Supported types: {', '.join(SUPPORTED_SUFFIXES)}."
        )
    if not path.is_file():
        raise DocumentError(f"{name}: file not found. Upload it again.")
    if path.stat().st_size == 0:
        raise DocumentError(f"{name} is empty (0 bytes). Choose a file that contains text.")

    if kind == "pdf":
        labels, pages = read_pdf(path, name)
        return _cut_pages(name, labels, [normalise(page) for page in pages])
    if kind in ("txt", "md"):
        text = decode_text(path.read_bytes(), name)
    elif kind == "html":
        text = _read_html(path.read_bytes(), name)
    elif kind == "epub":
        check_zip(path, name, "an EPUB book")
        text = read_epub(path, name)
    else:
        check_zip(path, name, "a Word document")
        text = read_docx(path, name)
    text = normalise(text)
    if len(text) <= MAX_TEXT_CHARS:
        return Extracted(name, kind, text)
    return Extracted(name, kind, text[:MAX_TEXT_CHARS], cut_from=len(text))


def _cut_pages(name: str, labels: list[str | None], pages: list[str]) -> Extracted:
    """The PDF's pages up to ``MAX_TEXT_CHARS`` characters in all (the last one kept cut short)."""
    total, kept = sum(len(page) for page in pages), 0
    if total > MAX_TEXT_CHARS:
        for number, page in enumerate(pages):
            if kept + len(page) > MAX_TEXT_CHARS:
                pages = pages[:number] + [page[:MAX_TEXT_CHARS - kept]]
                labels = labels[:number + 1]
                break
            kept += len(page)
    return Extracted(name, "pdf", pages=tuple(pages), labels=tuple(labels),
                     cut_from=total if total > MAX_TEXT_CHARS else None)


def _read_html(data: bytes, name: str) -> str:
    # UTF-16 pages are decoded first (their NUL bytes are not binary); the rest go in as bytes
    # so that BeautifulSoup honours the page's own <meta charset>.
    if data.count(0):
        return html_to_text(decode_text(data, name))
    refuse_binary(data, name)
    return html_to_text(data)
