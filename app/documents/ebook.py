"""EPUB books (chapters in spine order, each under its title) and Word .docx files (headings kept)."""

from __future__ import annotations

import logging
import posixpath
import re
import warnings
import zipfile
from pathlib import Path

import docx
from docx.opc.exceptions import PackageNotFoundError
from docx.table import Table
from ebooklib import epub
from lxml import etree

from app.documents.document import DocumentError
from app.documents.markup import html_to_text

logger = logging.getLogger(__name__)


def read_epub(path: Path, name: str) -> str:
    """Chapters in spine (reading) order, each starting with a ``# Title`` line."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ebooklib's FutureWarning/UserWarning chatter
            # The NCX is parsed only when the book has no EPUB 3 navigation page (EPUB 2 books).
            book = epub.read_epub(str(path), options={"ignore_ncx": True})
    # lxml's errors and ebooklib's TypeError/AttributeError: a package document it cannot make sense of.
    except (epub.EpubException, zipfile.BadZipFile, KeyError, ValueError, OSError, etree.LxmlError, TypeError,
            AttributeError) as exc:
        logger.debug("ebooklib failed on %s", name, exc_info=True)
        raise DocumentError(
            f"{name} could not be read as an EPUB: the file is damaged or not an e-book. "
            "Re-download or re-export it and try again."
        ) from exc

    if _is_drm_protected(path):
        raise DocumentError(
            f"{name} is DRM-protected: its chapters are encrypted and cannot be read. Use a DRM-free "
            "copy of the book (many shops offer one) or export it from the reading app you bought it in."
        )
    titles = _toc_titles(book.toc)
    chapters = []
    # Spine order is reading order; the manifest order is arbitrary.
    for idref, _linear in book.spine:
        item = book.get_item_with_id(idref)
        # Skips images in the spine and the EPUB 3 navigation page, which would only repeat
        # the table of contents ahead of the book.
        if not isinstance(item, epub.EpubHtml) or not item.is_chapter():
            continue
        chapter = html_to_text(item.get_content()).strip()
        title = titles.get(item.get_name()) or titles.get(posixpath.basename(item.get_name()))
        if chapter and title and not chapter.startswith("#"):
            chapter = f"# {title}\n\n{chapter}"
        if chapter:
            chapters.append(chapter)
    return "\n\n".join(chapters)


def _is_drm_protected(path: Path) -> bool:
    """Whether ``META-INF/encryption.xml`` encrypts text; fonts alone are obfuscated in many free books."""
    with zipfile.ZipFile(path) as archive:
        try:
            manifest = archive.read("META-INF/encryption.xml").decode("utf-8", "replace")
        except KeyError:
            return False
    uris = re.findall(r"""CipherReference[^>]*URI\s*=\s*["']([^"']+)""", manifest)
    return any(uri.lower().endswith((".xhtml", ".html", ".htm", ".xml")) for uri in uris)


def _toc_titles(toc) -> dict[str, str]:
    """File name -> title of the first table-of-contents entry that points into that file."""
    titles: dict[str, str] = {}
    for entry in toc:
        if isinstance(entry, tuple):  # (Section, children)
            section, children = entry
            nested = {getattr(section, "href", "") or "": section.title, **_toc_titles(children)}
        else:
            nested = {entry.href or "": entry.title}
        for href, title in nested.items():
            file_name = posixpath.normpath(href.split("#", 1)[0]) if href else ""
            if file_name and title and title.strip():
                titles.setdefault(file_name, " ".join(title.split()))
                # A navigation page in another folder links "../Text/ch1.xhtml": match by file name too.
                titles.setdefault(posixpath.basename(file_name), " ".join(title.split()))
    return titles


def read_docx(path: Path, name: str) -> str:
    """Paragraphs and tables in document order; "Heading N" and "Title" paragraphs as ``#`` lines."""
    try:
        document = docx.Document(str(path))
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError, etree.LxmlError) as exc:
        logger.debug("python-docx failed on %s", name, exc_info=True)
        raise DocumentError(
            f"{name} could not be read as a Word document (.docx). Old .doc files are not "
            "supported: save it as .docx or PDF and try again."
        ) from exc

    blocks = []
    # One look-up per style, not per paragraph: python-docx finds a paragraph's style by scanning every style of
    # the document (5 ms each), so 20,000 paragraphs took 100 s.
    levels: dict[str | None, int] = {}
    # iter_inner_content keeps paragraphs and tables in document order.
    for block in document.iter_inner_content():
        if isinstance(block, Table):
            blocks.append(_table_text(block))
        else:
            style_id = block._p.style  # the pStyle id, None for the default style
            level = levels[style_id] if style_id in levels else levels.setdefault(style_id, _heading_level(block))
            text = block.text
            blocks.append(f"{'#' * level} {' '.join(text.split())}" if level and text.strip() else text)
    return "\n\n".join(block for block in blocks if block.strip())


def _heading_level(paragraph) -> int:
    """1-6 for "Title" and "Heading N" styles (built-in or based on one), 0 for body text."""
    style = paragraph.style
    while style is not None:
        # Built-in style names are English in the file whatever the Word language (name is the id).
        style_name = (style.name or "").lower()
        if style_name == "title":
            return 1
        if style_name.startswith("heading "):
            level = style_name.removeprefix("heading ").strip()
            if level.isdigit():
                return min(max(int(level), 1), 6)
        style = style.base_style
    return 0


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
