"""Text files: binary content renamed .txt/.md/.html is refused; real text in any encoding is read."""

from __future__ import annotations

import gzip
import random
import sys

import pytest
from make_files import make_docx

from app.documents import DocumentError, read_document


@pytest.mark.parametrize("suffix", [".txt", ".md", ".html"])
def test_random_bytes_refused(tmp_path, suffix):
    path = tmp_path / f"noise{suffix}"
    path.write_bytes(random.Random(0).randbytes(50_000))
    with pytest.raises(DocumentError, match=rf"noise\{suffix} is not a text file: it contains binary data"):
        read_document(path)


def test_program_renamed_txt_refused(tmp_path):
    path = tmp_path / "python.txt"
    with open(sys.executable, "rb") as program:
        path.write_bytes(program.read(200_000))
    with pytest.raises(DocumentError, match="python.txt is not a text file") as info:
        read_document(path)
    assert "plain text" in str(info.value)


@pytest.mark.parametrize(("data", "what"), [
    (b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<< /Type /Catalog >>\nendobj\n" * 5, "a PDF document"),
    (b"\x89PNG\r\n\x1a\n" + bytes(200), "a PNG image"),
    (gzip.compress(b"plain words " * 500, mtime=0), "a gzip archive"),
], ids=["pdf", "png", "gzip"])  # fmt: skip
def test_known_binary_formats_named(tmp_path, data, what):
    path = tmp_path / "renamed.md"
    path.write_bytes(data)
    with pytest.raises(DocumentError, match=f"renamed.md is not a text file: it looks like {what}"):
        read_document(path)


def test_docx_renamed_txt_refused(tmp_path):
    path = make_docx(tmp_path / "report.docx", ["Quarterly report."])
    renamed = path.rename(tmp_path / "report.txt")
    with pytest.raises(DocumentError, match="report.txt is not a text file: it looks like a ZIP archive"):
        read_document(renamed)


@pytest.mark.parametrize("encoding", ["latin-1", "cp1252", "utf-8", "utf-16-le", "utf-16-be"])
def test_accented_text_in_any_encoding_accepted(tmp_path, encoding):
    text = "Élodie a lu « Les Misérables » à l’été ; ça coûte 12 € — très cher.\n\tFin.\x0c\n" * 40
    if encoding == "latin-1":
        text = text.replace("’", "'").replace("€", "EUR").replace("—", "-")
    path = tmp_path / "lettre.txt"
    path.write_bytes(text.encode(encoding))
    assert read_document(path).text.startswith("Élodie a lu « Les Misérables »")


def test_text_with_ansi_colours_accepted(tmp_path):
    path = tmp_path / "build.txt"
    path.write_bytes(b"\x1b[32mPASSED\x1b[0m test_one\n" * 100)
    assert "PASSED test_one" in read_document(path).text.replace("\x1b[32m", "").replace("\x1b[0m", "")


def test_large_text_with_binary_tail_refused(tmp_path):
    # A 6 MB file is judged on samples; binary data past the first megabytes is still seen.
    path = tmp_path / "dump.txt"
    path.write_bytes(b"A line of honest text.\n" * 100_000 + random.Random(1).randbytes(4_000_000))
    with pytest.raises(DocumentError, match="dump.txt is not a text file"):
        read_document(path)


def test_utf16_html_with_bom_reads(tmp_path):
    path = tmp_path / "page.html"
    path.write_bytes("<html><body><h1>Café</h1><p>Crème brûlée.</p></body></html>".encode("utf-16"))
    assert read_document(path).text == "# Café\n\nCrème brûlée."
