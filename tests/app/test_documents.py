"""app.documents on real files written into tmp_path (no mocks)."""

from __future__ import annotations

import dataclasses
import importlib.util
import zipfile

import pytest
from make_files import make_docx, make_encrypted_pdf, make_epub, make_pdf, make_scanned_pdf

from app.documents import SUPPORTED_SUFFIXES, Document, DocumentError, combine, read_document

FACT = "The lighthouse keeper's cat was named Bartholomew Quince."


def test_pdf_pages_are_marked_and_counted(tmp_path):
    path = make_pdf(tmp_path / "book.pdf", ["Opening page.", "Middle page.", FACT])
    doc = read_document(path)
    assert doc.kind == "pdf"
    assert doc.pages == 3
    assert doc.name == "book.pdf"
    assert "Bartholomew Quince" in doc.text
    assert doc.text.index("[page 3]") < doc.text.index("Bartholomew Quince")
    assert doc.text.index("[page 2]") < doc.text.index("[page 3]")
    assert "Bartholomew Quince" not in doc.text[: doc.text.index("[page 3]")]
    assert doc.chars == len(doc.text)


def test_display_name_overrides_temp_file_name(tmp_path):
    path = make_pdf(tmp_path / "upload_1234.pdf", ["Some text."])
    assert read_document(path, name="My Book.pdf").name == "My Book.pdf"


def test_password_protected_pdf(tmp_path):
    path = make_encrypted_pdf(tmp_path / "locked.pdf", user_password="secret")
    with pytest.raises(DocumentError, match="locked.pdf is password-protected"):
        read_document(path)


def test_pdf_with_owner_password_only_opens(tmp_path):
    path = make_encrypted_pdf(tmp_path / "restricted.pdf", user_password="", pages=[FACT])
    assert "Bartholomew Quince" in read_document(path).text


@pytest.mark.skipif(
    importlib.util.find_spec("cryptography") is None, reason="AES needs cryptography"
)
def test_aes_pdf_with_owner_password_only_opens(tmp_path):
    path = make_encrypted_pdf(
        tmp_path / "aes.pdf", user_password="", algorithm="AES-256", pages=[FACT]
    )
    assert "Bartholomew Quince" in read_document(path).text


@pytest.mark.parametrize("cut", [0.5, 0.9])
def test_truncated_pdf(tmp_path, cut):
    good = make_pdf(tmp_path / "good.pdf", ["One.", "Two.", "Three."]).read_bytes()
    path = tmp_path / "broken.pdf"
    path.write_bytes(good[: int(len(good) * cut)])
    with pytest.raises(DocumentError, match="broken.pdf could not be read as a PDF"):
        read_document(path)


def test_garbage_with_pdf_suffix(tmp_path):
    path = tmp_path / "notreally.pdf"
    path.write_bytes(b"This is not a PDF at all.\n" * 20)
    with pytest.raises(DocumentError, match="could not be read as a PDF") as info:
        read_document(path)
    assert "Traceback" not in str(info.value)


def test_scanned_pdf_suggests_ocr(tmp_path):
    path = make_scanned_pdf(tmp_path / "scan.pdf")
    with pytest.raises(DocumentError, match="scanned") as info:
        read_document(path)
    assert "OCR" in str(info.value)
    assert "text layer" in str(info.value)


@pytest.mark.parametrize("content", [b"", b"  \n\n\t  \r\n"])
def test_empty_text_file(tmp_path, content):
    path = tmp_path / "blank.txt"
    path.write_bytes(content)
    with pytest.raises(DocumentError, match="blank.txt is empty"):
        read_document(path)


def test_cp1252_text_decodes(tmp_path):
    path = tmp_path / "menu.txt"
    path.write_bytes("Un café, s’il vous plaît — très bon.".encode("cp1252"))
    doc = read_document(path)
    assert doc.kind == "txt"
    assert doc.pages is None
    assert doc.text == "Un café, s’il vous plaît — très bon."


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16"])
def test_unicode_text_decodes(tmp_path, encoding):
    path = tmp_path / "notes.txt"
    path.write_bytes("naïve Ωmega café".encode(encoding))
    assert read_document(path).text == "naïve Ωmega café"


def test_markdown_keeps_paragraphs_and_collapses_blank_lines(tmp_path):
    path = tmp_path / "notes.md"
    path.write_text("# Title   \n\nFirst paragraph.\n\n\n\n\nSecond paragraph.  \n", "utf-8")
    doc = read_document(path)
    assert doc.kind == "md"
    assert doc.text == "# Title\n\nFirst paragraph.\n\nSecond paragraph."


def test_markdown_long_suffix(tmp_path):
    path = tmp_path / "readme.markdown"
    path.write_text("Hello.", "utf-8")
    assert read_document(path).kind == "md"


def test_html_drops_scripts_and_styles(tmp_path):
    path = tmp_path / "page.htm"
    path.write_text(
        "<html><head><title>Page</title><style>body{color:red}</style>"
        "<script>var secret = 'DO_NOT_SHOW';</script></head>"
        "<body><h1>Heading</h1><p>A <b>bold</b> claim.</p><p>Second.</p></body></html>",
        "utf-8",
    )
    doc = read_document(path)
    assert doc.kind == "html"
    assert "DO_NOT_SHOW" not in doc.text
    assert "color:red" not in doc.text
    assert "A bold claim." in doc.text  # inline tags do not split the sentence
    assert doc.text.index("Heading") < doc.text.index("Second.")
    assert "Heading\n" in doc.text


def test_epub_chapters_in_spine_order(tmp_path):
    path = make_epub(
        tmp_path / "novel.epub",
        [("Chapter One", "It began on a Tuesday."), ("Chapter Two", FACT)],
    )
    doc = read_document(path)
    assert doc.kind == "epub"
    assert doc.pages is None
    assert doc.text.index("It began on a Tuesday.") < doc.text.index("Bartholomew Quince")
    assert "<p>" not in doc.text
    assert doc.text.count("Chapter One") == 1  # the navigation page (table of contents) is skipped


def test_corrupted_epub(tmp_path):
    path = tmp_path / "bad.epub"
    path.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(DocumentError, match="bad.epub could not be read as an EPUB"):
        read_document(path)


def test_docx_paragraphs_and_table(tmp_path):
    path = make_docx(
        tmp_path / "report.docx",
        ["Quarterly report.", FACT],
        table=[["Region", "Sales"], ["North", "42 units"]],
    )
    doc = read_document(path)
    assert doc.kind == "docx"
    assert "Quarterly report." in doc.text
    assert "Bartholomew Quince" in doc.text
    assert "North | 42 units" in doc.text
    assert doc.text.index("Bartholomew Quince") < doc.text.index("Region")


def test_corrupted_docx(tmp_path):
    path = tmp_path / "old.docx"
    path.write_bytes(b"\xd0\xcf\x11\xe0 legacy .doc bytes")
    with pytest.raises(DocumentError, match="old.docx could not be read as a Word document"):
        read_document(path)


def test_unsupported_suffix_lists_types(tmp_path):
    path = tmp_path / "data.xyz"
    path.write_text("whatever", "utf-8")
    with pytest.raises(DocumentError, match="unsupported file type") as info:
        read_document(path)
    for suffix in SUPPORTED_SUFFIXES:
        assert suffix in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(DocumentError, match="not found"):
        read_document(tmp_path / "gone.txt")


def test_document_is_frozen():
    doc = Document(name="a.txt", kind="txt", text="hello", pages=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        doc.text = "changed"  # type: ignore[misc]


def test_combine_introduces_each_document():
    docs = [
        Document(name="a.txt", kind="txt", text="Alpha text.", pages=None),
        Document(name="b.pdf", kind="pdf", text="[page 1]\nBeta text.", pages=1),
    ]
    combined = combine(docs)
    assert combined.startswith("=== a.txt ===\nAlpha text.")
    assert "=== b.pdf ===\n[page 1]\nBeta text." in combined
    assert combined.index("=== a.txt ===") < combined.index("=== b.pdf ===")
    assert combine([]) == ""


# --- HTML, EPUB and DOCX structure ----------------------------------------------------------------


def test_html_keeps_main_content_drops_site_chrome(tmp_path):
    path = tmp_path / "article.html"
    path.write_text(
        "<html><body><header><a href='/'>Home</a> | <a href='/blog'>Blog</a></header>"
        "<nav><ul><li>Archive</li><li>About</li></ul></nav>"
        "<div class='sidebar'>Popular posts</div>"
        "<main><article><header><h1>The Keeper</h1><p>by Mara</p></header>"
        f"<p>{FACT}</p><h2>Later</h2><table><tr><th>Year</th><th>Cats</th></tr>"
        "<tr><td><p>1901</p></td><td>one <b>cat</b></td></tr></table></article></main>"
        "<aside>Related: other keepers</aside><footer>© 2026 Lighthouse blog</footer></body></html>",
        "utf-8",
    )
    text = read_document(path).text
    for chrome in ("Home", "Blog", "Archive", "Popular posts", "Related", "© 2026"):
        assert chrome not in text
    assert text.startswith("# The Keeper\n\nby Mara")
    assert "## Later" in text.splitlines()
    assert "Year | Cats\n1901 | one cat" in text
    assert FACT in text


def test_epub_chapter_title_from_table_of_contents(tmp_path):
    path = make_epub(tmp_path / "plain.epub",
                     [("The Calm", "It began on a Tuesday."), ("The Storm", FACT)], headings=False)
    text = read_document(path).text
    assert text.index("# The Calm\n\nIt began") < text.index("# The Storm\n\n" + FACT)


def test_docx_headings_become_markdown(tmp_path):
    path = make_docx(tmp_path / "manual.docx", [
        (0, "Keeper's Manual"), (1, "Lamps"), "Trim the wick daily.", (2, "Spare parts"),
        "Keep two spare mantles.",
    ])  # fmt: skip
    text = read_document(path).text
    assert text == ("# Keeper's Manual\n\n# Lamps\n\nTrim the wick daily.\n\n## Spare parts\n\n"
                    "Keep two spare mantles.")


def _add_encryption_manifest(path, uri):
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("META-INF/encryption.xml", (
            '<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" '
            'xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData>'
            '<enc:EncryptionMethod Algorithm="http://www.w3.org/2001/04/xmlenc#aes128-cbc"/>'
            f'<enc:CipherData><enc:CipherReference URI="{uri}"/></enc:CipherData>'
            "</enc:EncryptedData></encryption>"))  # fmt: skip


def test_drm_protected_epub_refused(tmp_path):
    path = make_epub(tmp_path / "bought.epub", [("One", "It began on a Tuesday.")])
    _add_encryption_manifest(path, "EPUB/chap_1.xhtml")
    with pytest.raises(DocumentError, match="bought.epub is DRM-protected"):
        read_document(path)


def test_epub_with_obfuscated_fonts_only_reads(tmp_path):
    path = make_epub(tmp_path / "free.epub", [("One", FACT)])
    _add_encryption_manifest(path, "EPUB/fonts/serif.otf")
    assert FACT in read_document(path).text


@pytest.mark.parametrize(("encoding", "meta"), [
    ("iso-8859-1", '<meta charset="iso-8859-1">'),
    ("cp1252", '<meta http-equiv="Content-Type" content="text/html; charset=windows-1252">'),
    ("utf-8", ""),  # no declaration: UTF-8 is tried first
])  # fmt: skip
def test_html_encoding_from_the_page(tmp_path, encoding, meta):
    path = tmp_path / "menu.html"
    path.write_bytes(f"<html><head>{meta}</head><body><p>Crème brûlée, très bon.</p></body></html>"
                     .encode(encoding))
    assert read_document(path).text == "Crème brûlée, très bon."


def test_xhtml_with_xml_declaration_and_comments(tmp_path):
    path = tmp_path / "chapter.xhtml.html"
    path.write_bytes(b'<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html>\n'
                     b'<html xmlns="http://www.w3.org/1999/xhtml"><body><!-- hidden note -->'
                     b'<h2>Sto<i>rm</i></h2><p>Wind &amp; rain<br/>all night.</p></body></html>')
    assert read_document(path).text == "## Storm\n\nWind & rain\nall night."
