"""Turn uploaded files (PDF, text, Markdown, HTML, EPUB, DOCX) into plain text for the prompt.

Every failure the user can cause (wrong type, encrypted, scanned, corrupted, empty) is raised
as :class:`DocumentError` with a message meant to be shown as-is in the UI.
"""

from __future__ import annotations

import codecs
import logging
import re
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import docx
from bs4 import BeautifulSoup, XMLParsedAsHTMLWarning
from docx.opc.exceptions import PackageNotFoundError
from docx.table import Table
from ebooklib import epub
from pypdf import PasswordType, PdfReader
from pypdf.errors import DependencyError, FileNotDecryptedError, PyPdfError

log = logging.getLogger(__name__)

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

# Block-level elements end a line; inline ones (<b>, <a>, <span>) must not, or get_text("\n")
# would break sentences apart at every bold word.
_BLOCK_TAGS = (
    "p", "div", "br", "li", "ul", "ol", "tr", "table", "section", "article", "header",
    "footer", "blockquote", "pre", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "dd", "dt",
    "figcaption", "title", "aside", "nav", "main",
)  # fmt: skip
_INVISIBLE_TAGS = ("script", "style", "noscript", "template")

# Legacy single-byte fallbacks, in order. cp1252 first because Western books saved on Windows
# are by far the most common non-UTF-8 text; latin-1 decodes any byte so it always ends the chain.
# charset_normalizer is deliberately not used: on short Western text it guesses cp1250 and
# turns "très" into "trčs".
_FALLBACK_ENCODINGS = ("cp1252", "latin-1")


class DocumentError(ValueError):
    """User-facing message: what is wrong with which file and what to do."""


@dataclass(frozen=True)
class Document:
    """One uploaded file as plain text.

    Attributes:
        name: file name shown to the user.
        kind: ``"pdf" | "txt" | "md" | "html" | "epub" | "docx"``.
        text: extracted text; PDFs carry a ``[page N]`` line before each page's text so that
            answers can cite pages.
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


def read_document(path: str | Path, name: str | None = None) -> Document:
    """Read one file into a :class:`Document`.

    Args:
        path: file on disk; its suffix picks the reader.
        name: name shown to the user (uploads land under temporary names); defaults to the
            file name of ``path``.

    Raises:
        DocumentError: unsupported type, missing, empty, encrypted, scanned or unreadable file.
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
        text, pages = _read_pdf(path, name)
    elif kind in ("txt", "md"):
        text = _decode(path.read_bytes())
    elif kind == "html":
        text = _html_to_text(path.read_bytes())
    elif kind == "epub":
        text = _read_epub(path, name)
    else:
        text = _read_docx(path, name)

    text = _normalise(text)
    if not text:
        raise DocumentError(f"{name} is empty: it contains no text to ask questions about.")
    document = Document(name=name, kind=kind, text=text, pages=pages)
    log.info(
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


def _read_pdf(path: Path, name: str) -> tuple[str, int]:
    unreadable = DocumentError(
        f"{name} could not be read as a PDF: the file is damaged or incomplete. "
        "Re-download or re-export it and try again."
    )
    try:
        reader = PdfReader(path)
        if reader.is_encrypted:
            # Many PDFs are encrypted only to restrict printing/copying, with an empty
            # user password; those open normally.
            if reader.decrypt("") == PasswordType.NOT_DECRYPTED:
                raise _password_error(name)
        page_list = list(reader.pages)
    except DocumentError:
        raise
    except FileNotDecryptedError as exc:
        raise _password_error(name) from exc
    except DependencyError as exc:
        raise DocumentError(
            f"{name} uses PDF encryption this installation cannot open "
            "(install the 'cryptography' package), or save an unencrypted copy."
        ) from exc
    except (PyPdfError, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        # pypdf raises assorted built-in errors on malformed files, not only PyPdfError.
        log.debug("pypdf failed on %s", name, exc_info=True)
        raise unreadable from exc

    parts = []
    failed = 0
    has_text = False
    for number, page in enumerate(page_list, start=1):
        try:
            page_text = page.extract_text() or ""
        except (PyPdfError, ValueError, KeyError, TypeError, AttributeError):
            # One broken page should not cost the user the rest of the book.
            log.warning("could not extract text of page %d of %s", number, name, exc_info=True)
            failed += 1
            page_text = ""
        has_text = has_text or bool(page_text.strip())
        parts.append(f"[page {number}]\n{page_text.strip()}")

    if not page_list:
        raise DocumentError(f"{name} is empty: the PDF has no pages.")
    if not has_text:
        if failed == len(page_list):
            raise unreadable
        raise DocumentError(
            f"{name} has no text layer (it looks like a scanned document or images only). "
            "Run it through OCR (e.g. ocrmypdf) to add a text layer, then upload it again."
        )
    return "\n\n".join(parts), len(page_list)


def _password_error(name: str) -> DocumentError:
    return DocumentError(
        f"{name} is password-protected. Remove the password (e.g. print or save it as an "
        "unprotected PDF) and upload it again."
    )


def _decode(data: bytes) -> str:
    # Notepad's "Unicode" is UTF-16 with a BOM; utf-8-sig also accepts plain UTF-8.
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError:
            pass
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    for encoding in _FALLBACK_ENCODINGS:
        try:
            text = data.decode(encoding)
        except UnicodeDecodeError:
            continue
        log.info("text is not UTF-8; decoded as %s", encoding)
        return text
    raise AssertionError("latin-1 decodes every byte string")  # pragma: no cover


def _html_to_text(markup: bytes | str) -> str:
    # Bytes go in unchanged so BeautifulSoup honours the page's own <meta charset>.
    soup = BeautifulSoup(markup, "lxml")
    for tag in soup.find_all(_INVISIBLE_TAGS):
        tag.decompose()
    for tag in soup.find_all(_BLOCK_TAGS):
        tag.insert_after("\n")
    text = soup.get_text()
    # Source indentation is meaningless in HTML; drop it per line.
    return "\n".join(line.strip() for line in text.splitlines())


def _read_epub(path: Path, name: str) -> str:
    try:
        # ignore_ncx: the NCX table of contents is unused here and only triggers a warning.
        book = epub.read_epub(str(path), options={"ignore_ncx": True})
    except (epub.EpubException, zipfile.BadZipFile, KeyError, ValueError, OSError) as exc:
        log.debug("ebooklib failed on %s", name, exc_info=True)
        raise DocumentError(
            f"{name} could not be read as an EPUB: the file is damaged or not an e-book. "
            "Re-download or re-export it and try again."
        ) from exc

    chapters = []
    # Spine order is reading order; the manifest order is arbitrary.
    for idref, _linear in book.spine:
        item = book.get_item_with_id(idref)
        # Skips images in the spine and the EPUB 3 navigation page, which would only repeat
        # the table of contents ahead of the book.
        if not isinstance(item, epub.EpubHtml) or not item.is_chapter():
            continue
        with warnings.catch_warnings():
            # Chapters are XHTML; the HTML parser reads them fine and forgives the broken
            # markup common in real e-books, where the strict XML parser would drop text.
            warnings.simplefilter("ignore", XMLParsedAsHTMLWarning)
            chapter = _html_to_text(item.get_content()).strip()
        if chapter:
            chapters.append(chapter)
    return "\n\n".join(chapters)


def _read_docx(path: Path, name: str) -> str:
    try:
        document = docx.Document(str(path))
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError) as exc:
        log.debug("python-docx failed on %s", name, exc_info=True)
        raise DocumentError(
            f"{name} could not be read as a Word document (.docx). Old .doc files are not "
            "supported: save it as .docx or PDF and try again."
        ) from exc

    blocks = []
    # iter_inner_content keeps paragraphs and tables in document order.
    for block in document.iter_inner_content():
        if isinstance(block, Table):
            blocks.append(_table_text(block))
        else:
            blocks.append(block.text)
    return "\n\n".join(block for block in blocks if block.strip())


def _table_text(table: Table) -> str:
    rows = []
    for row in table.rows:
        cells: list[str] = []
        for cell in row.cells:
            text = cell.text.strip()
            # A merged cell is returned once per grid column it spans; keep it once.
            if not cells or text != cells[-1]:
                cells.append(text)
        rows.append(" | ".join(cells))
    return "\n".join(rows)


def _normalise(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    text = re.sub(r"[ \t\f\v]+$", "", text, flags=re.MULTILINE)
    # At most one blank line between paragraphs: extra blank lines only cost tokens.
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()
