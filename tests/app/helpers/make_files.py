"""Real document files for tests: PDFs (plain, encrypted, scanned), EPUB and DOCX.

Every generator writes a genuine file with the library a user's software would produce it
with, so the readers are exercised on real bytes, not mocks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import docx
from ebooklib import epub
from fpdf import FPDF
from PIL import Image, ImageDraw
from pypdf import PdfReader, PdfWriter


def make_pdf(path: str | Path, pages: Sequence[str], header: str | None = None,
             footer: str | None = None, first_number: int = 1) -> Path:
    """Write a PDF with one page per string (core Helvetica font, so latin-1 text only).

    ``header`` and ``footer`` are running lines printed on every page, with ``{page}`` and
    ``{pages}`` filled in ("My Book {page} / {pages}"); a ``\\n`` in a page's text ends its line.
    ``first_number``: the number printed as ``{page}`` on the first page (a chapter printed from page 35).
    """
    path = Path(path)

    class Book(FPDF):
        def header(self):
            if header:
                self.set_font("Helvetica", size=9)
                self.cell(0, 8, header.format(page=self.page_no() - 1 + first_number, pages=len(pages)), align="C")
                self.ln(12)
                self.set_font("Helvetica", size=12)

        def footer(self):
            if footer:
                self.set_y(-15)
                self.set_font("Helvetica", size=9)
                self.cell(0, 8, footer.format(page=self.page_no() - 1 + first_number, pages=len(pages)), align="C")

    pdf = Book()
    pdf.set_font("Helvetica", size=12)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 8, text)
    pdf.output(str(path))
    return path


def make_labelled_pdf(path: str | Path, pages: Sequence[str], *, roman_pages: int, first_number: int) -> Path:
    """A PDF whose /PageLabels (written by pypdf) number its first ``roman_pages`` pages i, ii, ... and the rest
    from ``first_number`` on, as a book's front matter and a chapter printed from page ``first_number``."""
    path = make_pdf(path, pages)
    writer = PdfWriter(clone_from=PdfReader(path))
    writer.set_page_label(0, roman_pages - 1, style="/r", start=1)
    writer.set_page_label(roman_pages, len(pages) - 1, style="/D", start=first_number)
    writer.write(path)
    return path


def make_encrypted_pdf(
    path: str | Path,
    user_password: str = "secret",
    owner_password: str | None = None,
    algorithm: str = "RC4-128",
    pages: Sequence[str] = ("This text is locked.",),
) -> Path:
    """Write an encrypted PDF.

    With a non-empty ``user_password`` the file needs that password to open. With
    ``user_password=""`` it opens without one (owner password only, the common
    "no copying/printing" kind). RC4 is the default because pypdf handles it without the
    optional ``cryptography`` package; AES variants need it.
    """
    path = Path(path)
    make_pdf(path, pages)
    writer = PdfWriter(clone_from=PdfReader(path))
    writer.encrypt(
        user_password=user_password,
        owner_password=owner_password or "owner-" + (user_password or "only"),
        algorithm=algorithm,
    )
    with path.open("wb") as handle:
        writer.write(handle)
    return path


def make_scanned_pdf(path: str | Path, pages: int = 2) -> Path:
    """Write a PDF whose pages hold only an image of text and drawn shapes: no text layer."""
    path = Path(path)
    image = Image.new("RGB", (600, 200), "white")
    ImageDraw.Draw(image).text((20, 80), "Scanned page: this text is pixels only.", fill="black")
    pdf = FPDF()
    for _ in range(pages):
        pdf.add_page()
        pdf.image(image, x=10, y=10, w=180)
        pdf.rect(10, 100, 100, 50)
        pdf.line(10, 160, 190, 160)
    pdf.output(str(path))
    return path


def make_epub(path: str | Path, chapters: Sequence[tuple[str, str]], headings: bool = True) -> Path:
    """Write an EPUB 3 book with one XHTML item per ``(title, body)`` chapter.

    Items are added to the manifest in reverse order while the spine keeps the given order,
    so a reader that ignores the spine reads the chapters backwards. With ``headings=False``
    a chapter's title is only in the table of contents, not in its text.
    """
    path = Path(path)
    book = epub.EpubBook()
    book.set_identifier("test-book-1")
    book.set_title("Test Book")
    book.set_language("en")
    book.add_author("Test Author")
    items = []
    for number, (title, body) in enumerate(chapters, start=1):
        item = epub.EpubHtml(title=title, file_name=f"chap_{number}.xhtml", lang="en")
        item.content = (f"<h1>{title}</h1>" if headings else "") + f"<p>{body}</p>"
        items.append(item)
    for item in reversed(items):
        book.add_item(item)
    book.toc = items
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", *items]
    epub.write_epub(str(path), book)
    return path


def make_docx(
    path: str | Path,
    paragraphs: Sequence[str | tuple[int, str]],
    table: Sequence[Sequence[str]] | None = None,
) -> Path:
    """Write a DOCX with the given paragraphs, then an optional table (rows of cell strings).

    A ``(level, text)`` paragraph is a heading in Word's built-in style: level 0 is "Title",
    1-9 are "Heading 1"-"Heading 9".
    """
    path = Path(path)
    document = docx.Document()
    for paragraph in paragraphs:
        if isinstance(paragraph, tuple):
            document.add_heading(paragraph[1], level=paragraph[0])
        else:
            document.add_paragraph(paragraph)
    if table:
        grid = document.add_table(rows=len(table), cols=len(table[0]))
        for row, values in zip(grid.rows, table):
            for cell, value in zip(row.cells, values):
                cell.text = value
    document.save(str(path))
    return path
