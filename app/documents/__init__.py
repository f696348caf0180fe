"""Turn uploaded files (PDF, text, Markdown, HTML, EPUB, DOCX) into plain text for the prompt.

Every failure the user can cause (wrong type, encrypted, scanned, corrupted, empty, binary) is
raised as :class:`DocumentError` with a message meant to be shown as-is in the UI.

One module per job: ``pdf`` (PDFium, pypdf fallback) and ``pdf_layout`` (running headers,
hyphenation), ``text`` (encodings, binary files refused), ``markup`` (HTML), ``ebook`` (EPUB, DOCX), ``archive``
(an EPUB's or DOCX's zip sized before it is inflated), ``extract`` (one file's text, by its kind), ``sandbox`` (that,
in a child process with memory and time limits: how uploads are read) and ``limits`` (every such limit).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Sequence

from app.documents.document import Document, DocumentError
from app.documents.extract import SUPPORTED_SUFFIXES, Extracted, extract
from app.documents.pdf import join_pages
from app.documents.sandbox import Box, shared_box

__all__ = ["SUPPORTED_SUFFIXES", "Box", "Document", "DocumentError", "Extracted", "combine", "finish",
           "read_document", "shared_box"]

logger = logging.getLogger(__name__)


def read_document(path: str | Path, name: str | None = None, box: Box | None = None) -> Document:
    """Read one file into a :class:`Document`.

    Args:
        path: file on disk; its suffix picks the reader.
        name: name shown to the user (uploads land under temporary names); defaults to the
            file name of ``path``.
        box: read it in this box's child process (an upload: untrusted bytes); ``None`` reads it in this
            process (the app's own files, tests, benchmarks).

    Raises:
        DocumentError: unsupported type, missing, empty, encrypted, scanned, binary, unreadable file, or (in a box)
            one that took too long or too much memory to read.
    """
    path = Path(path)
    name = name or path.name
    return finish(box.extract(path, name) if box is not None else extract(path, name))


def finish(extracted: Extracted) -> Document:
    """The :class:`Document` of an extracted file: a PDF's pages joined with the engine's page markers.

    Raises:
        DocumentError: the file holds no text.
    """
    text = extracted.text
    if extracted.pages is not None:
        # Only linear work on the text here (the reading child did the rest): blank pages leave runs of newlines.
        text = re.sub(r"\n{3,}", "\n\n", join_pages(extracted.labels, extracted.pages)).strip()
    if not text:
        raise DocumentError(f"{extracted.name} is empty: it contains no text to ask questions about.")
    pages = len(extracted.pages) if extracted.pages is not None else None
    document = Document(name=extracted.name, kind=extracted.kind, text=text, pages=pages)
    logger.info(
        "read %s (%s): %d chars%s",
        extracted.name,
        extracted.kind,
        document.chars,
        f", {pages} pages" if pages is not None else "",
    )
    return document


def combine(documents: Sequence[Document]) -> str:
    """Join documents into one prompt text, each introduced by a ``=== <name> ===`` line."""
    return "\n\n".join(f"=== {doc.name} ===\n{doc.text}" for doc in documents)
