"""What every reader returns or raises: :class:`Document` and :class:`DocumentError`."""

from __future__ import annotations

from dataclasses import dataclass


class DocumentError(ValueError):
    """User-facing message: what is wrong with which file and what to do."""


@dataclass(frozen=True)
class Document:
    """One uploaded file as plain text.

    Attributes:
        name: file name shown to the user.
        kind: ``"pdf" | "txt" | "md" | "html" | "epub" | "docx"``.
        text: extracted text; PDFs carry a ``[page N]`` line before each page's text so that
            answers can cite pages; headings of HTML, EPUB and DOCX files are ``# Title`` lines
            (one ``#`` per level).
        pages: page count for PDFs, ``None`` for every other kind.
    """

    name: str
    kind: str
    text: str
    pages: int | None = None

    @property
    def chars(self) -> int:
        """Length of the extracted text in characters."""
        return len(self.text)
