"""Turn uploaded files (PDF, text, Markdown, HTML, EPUB, DOCX) into plain text for the prompt.

Every failure the user can cause (wrong type, encrypted, scanned, corrupted, empty, binary) is
raised as :class:`DocumentError` with a message meant to be shown as-is in the UI.

One module per job: ``pdf`` (PDFium, pypdf fallback) and ``pdf_layout`` (running headers,
hyphenation), ``text`` (encodings, binary files refused), ``markup`` (HTML), ``ebook`` (EPUB, DOCX).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

from app.documents.base import Document, DocumentError
from app.documents.ebook import read_docx, read_epub
from app.documents.markup import html_to_text
from app.documents.pdf import read_pdf
from app.documents.text import decode_text, normalise, refuse_binary

__all__ = ["SUPPORTED_SUFFIXES", "Document", "DocumentError", "combine", "read_document"]

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


def read_document(path: str | Path, name: str | None = None) -> Document:
    """Read one file into a :class:`Document`.

    Args:
        path: file on disk; its suffix picks the reader.
        name: name shown to the user (uploads land under temporary names); defaults to the
            file name of ``path``.

    Raises:
        DocumentError: unsupported type, missing, empty, encrypted, scanned, binary or unreadable file.
    """
    path = Path(path)
    name = name or path.name
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

    pages = None
    if kind == "pdf":
        text, pages = read_pdf(path, name)
    elif kind in ("txt", "md"):
        text = decode_text(path.read_bytes(), name)
    elif kind == "html":
        text = _read_html(path.read_bytes(), name)
    elif kind == "epub":
        text = read_epub(path, name)
    else:
        text = read_docx(path, name)

    text = normalise(text)
    if not text:
        raise DocumentError(f"{name} is empty: it contains no text to ask questions about.")
    document = Document(name=name, kind=kind, text=text, pages=pages)
    logger.info(
        "read %s (%s): %d chars%s",
        name,
        kind,
        document.chars,
        f", {pages} pages" if pages is not None else "",
    )
    return document


def combine(documents: Sequence[Document]) -> str:
    """Join documents into one prompt text, each introduced by a ``=== <name> ===`` line."""
    return "\n\n".join(f"=== {doc.name} ===\n{doc.text}" for doc in documents)


def _read_html(data: bytes, name: str) -> str:
    # UTF-16 pages are decoded first (their NUL bytes are not binary); the rest go in as bytes
    # so that BeautifulSoup honours the page's own <meta charset>.
    if data.count(0):
        return html_to_text(decode_text(data, name))
    refuse_binary(data, name)
    return html_to_text(data)
