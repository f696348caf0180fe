"""PDF pages to text: PDFium (pypdfium2) first, pypdf when PDFium cannot open the file.

PDFium (Chrome's PDF engine) places spaces from the glyph geometry, so LaTeX books read as words
("There are two methods") where pypdf runs them together ("Therearetwomethods"), and it is much
faster on real books (docs/benchmarks/extraction.md). pypdf stays as the fallback: it tells apart the encryption it cannot open (a missing
``cryptography`` package) and salvages some files PDFium rejects.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Sequence

from pypdf import PasswordType, PdfReader
from pypdf.errors import DependencyError, FileNotDecryptedError, PyPdfError

from app.documents.document import DocumentError
from app.documents.pdf_layout import clean_pages, printed_numbers

try:
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_raw
except ImportError:  # pragma: no cover - a requirement; pypdf alone still reads PDFs
    pdfium = None

logger = logging.getLogger(__name__)

# PDFium is not thread-safe, and Gradio runs handlers of several visitors in threads.
_PDFIUM_LOCK = threading.Lock()


def read_pdf(path: Path, name: str) -> tuple[list[str | None], list[str]]:
    """``(labels, pages)``: each page's cleaned text (running headers and footers out, hyphenation undone) and the
    number the book prints on it (its PDF page label, else the number its running header or footer carried, which
    cleaning then strips; ``None`` for a page that prints none, all ``None`` for a PDF that prints no number).
    ``join_pages`` makes them one text."""
    found = pdfium_pages(path, name) if pdfium is not None else None
    pages, labels = found if found is not None else pypdf_pages(path, name)
    if not pages:
        raise DocumentError(f"{name} is empty: the PDF has no pages.")
    if not any(page and page.strip() for page in pages):
        if all(page is None for page in pages):
            raise _unreadable(name)
        raise DocumentError(
            f"{name} has no text layer (it looks like a scanned document or images only). "
            "Run it through OCR (e.g. ocrmypdf) to add a text layer, then upload it again."
        )
    raw = [page or "" for page in pages]
    if not any(labels):
        numbers = printed_numbers(raw)
        labels = [None if number is None else str(number) for number in numbers]
    return list(labels), clean_pages(raw)


def join_pages(labels: Sequence[str | None], pages: Sequence[str]) -> str:
    """The pages as one text, a marker line before each page's text (``engine.types.page_marker``): its printed
    label, ``[page N]`` in PDF order for a PDF that prints none."""
    # Imported here: the reading child imports this module, and the engine (torch) stays out of it.
    from engine.types import page_marker

    if not any(labels):  # no printed numbers at all: the PDF's own order
        labels = [str(number) for number in range(1, len(pages) + 1)]
    return "\n\n".join(f"{page_marker(label, number)}\n{page}"
                        for number, (label, page) in enumerate(zip(labels, pages), start=1))


def _label(label: str | None) -> str | None:
    """A page label as a marker holds it (one line, short); None for none."""
    label = " ".join((label or "").split())[:24].replace("]", ")")
    return label or None


def pdfium_pages(path: Path, name: str) -> tuple[list[str | None], list[str | None]] | None:
    """Raw text of every page (``None`` for a page that failed) and its page label (``None`` for none), or
    ``None`` when PDFium cannot open the file.

    Raises:
        DocumentError: the file needs a password.
    """
    with _PDFIUM_LOCK:
        try:
            document = pdfium.PdfDocument(str(path))
        except pdfium.PdfiumError as exc:
            if exc.err_code == pdfium_raw.FPDF_ERR_PASSWORD:
                raise _password_error(name) from exc
            logger.info("PDFium could not open %s (%s); trying pypdf", name, exc)
            return None
        try:
            texts = [_pdfium_page_text(document, index, name) for index in range(len(document))]
            return texts, [_label(_pdfium_label(document, index)) for index in range(len(document))]
        finally:
            document.close()


def _pdfium_label(document, index: int) -> str | None:
    try:
        return document.get_page_label(index)
    except (pdfium.PdfiumError, UnicodeDecodeError):
        return None


def _pdfium_page_text(document, index: int, name: str) -> str | None:
    try:
        page = document[index]
        try:
            text_page = page.get_textpage()
            try:
                return text_page.get_text_range()
            finally:
                text_page.close()
        finally:
            page.close()
    except pdfium.PdfiumError:
        # One broken page should not cost the user the rest of the book.
        logger.warning("could not extract text of page %d of %s", index + 1, name, exc_info=True)
        return None


def pypdf_pages(path: Path, name: str) -> tuple[list[str | None], list[str | None]]:
    """Raw text of every page with pypdf (``None`` for a page that failed), and the page labels the PDF sets.

    Raises:
        DocumentError: password-protected, encryption it cannot open, or not a readable PDF.
    """
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
        logger.debug("pypdf failed on %s", name, exc_info=True)
        raise _unreadable(name) from exc

    pages: list[str | None] = []
    for number, page in enumerate(page_list, start=1):
        try:
            pages.append(page.extract_text() or "")
        except (PyPdfError, ValueError, KeyError, TypeError, AttributeError):
            logger.warning("could not extract text of page %d of %s", number, name, exc_info=True)
            pages.append(None)
    try:
        labels = [_label(label) for label in reader.page_labels] if "/PageLabels" in reader.trailer["/Root"] else []
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError):
        labels = []
    return pages, labels if len(labels) == len(pages) else [None] * len(pages)


def _unreadable(name: str) -> DocumentError:
    return DocumentError(
        f"{name} could not be read as a PDF: the file is damaged or incomplete. "
        "Re-download or re-export it and try again."
    )


def _password_error(name: str) -> DocumentError:
    return DocumentError(
        f"{name} is password-protected. Remove the password (e.g. print or save it as an "
        "unprotected PDF) and upload it again."
    )
