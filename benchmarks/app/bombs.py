"""Decompression and entity bombs against the document readers: each file is ~1 MB or less on disk and
inflates to gigabytes, plus one good file in the same set; the table says how long each took to be refused
and how much memory the reading process (the app's own) and its extraction child reached.

    python -m benchmarks.app.bombs   # before (app.documents as of BEFORE, in the reading process) and after
                                 # (app.sizing.read_sized: checked zips, a boxed child), one table

Each file is read in a fresh Python process capped at 3 GiB of address space (``RLIMIT_AS``), so a bomb that
gets through cannot take this machine's memory; before, such a bomb ends in ``MemoryError``, a parser's error or
PDFium's abort (which would have taken the app down with it).
The files are real: zipfile, ebooklib, python-docx and fpdf2 write them (docs/benchmarks/bombs.md).
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import docx
from ebooklib import epub
from fpdf import FPDF


BEFORE = "ed8a95f"  # app/documents before the box (issue 54)
ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
CAP_BYTES = 3 * GIB  # the reading process's address space in the measurement (the 3 GiB cap)
_CHUNK = 1 << 24  # 16 MiB written at a time: the bomb is streamed into the zip, never held whole


def make_good_epub(path: Path) -> Path:
    """A small real book (ebooklib) that must still read beside the bombs."""
    book = epub.EpubBook()
    book.set_identifier("good-book")
    book.set_title("Good Book")
    book.set_language("en")
    chapter = epub.EpubHtml(title="Harbour", file_name="harbour.xhtml", lang="en")
    chapter.content = "<h1>Harbour</h1><p>The harbour master keeps the tide tables in a blue tin.</p>"
    book.add_item(chapter)
    book.toc = [chapter]
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", chapter]
    epub.write_epub(str(path), book)
    return path


def make_good_docx(path: Path, text: str = "The ferry leaves at seven from pier four.") -> Path:
    document = docx.Document()
    document.add_paragraph(text)
    document.save(str(path))
    return path


def _rewrite(source: Path, target: Path, members: dict[str, Iterable[bytes]]) -> Path:
    """``source`` with each of ``members`` replaced by its chunks, deflated as they are written (never held whole)."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as new:
        for info in old.infolist():
            if info.filename not in members:
                new.writestr(info, old.read(info.filename))
                continue
            entry = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            entry.compress_type = zipfile.ZIP_DEFLATED  # ZipInfo's own default is stored, whatever the archive's
            with new.open(entry, "w") as out:  # 32-bit sizes: every bomb here inflates under 2 GiB
                for chunk in members[info.filename]:
                    out.write(chunk)
    source.unlink()
    return target


def _repeated(head: bytes, filler: bytes, size: int, tail: bytes) -> Iterator[bytes]:
    yield head
    block = filler * (_CHUNK // len(filler))
    for _ in range(size // len(block)):
        yield block
    yield tail


def make_zip_bomb_epub(path: Path, inflated: int = GIB // 2) -> Path:
    """A real EPUB whose one chapter inflates to ``inflated`` bytes of paragraphs (~1 MB on disk for 512 MiB)."""
    good = make_good_epub(path.with_name(path.stem + "-seed.epub"))
    head = b'<?xml version="1.0" encoding="utf-8"?>\n<html xmlns="http://www.w3.org/1999/xhtml"><body>'
    return _rewrite(good, path, {"EPUB/harbour.xhtml": _repeated(head, b"<p>lol</p>", inflated, b"</body></html>")})


def make_zip_bomb_docx(path: Path, inflated: int = GIB // 3) -> Path:
    """A real DOCX (python-docx) whose ``word/document.xml`` inflates to ``inflated`` bytes of runs (~1 MB)."""
    good = make_good_docx(path.with_name(path.stem + "-seed.docx"))
    head = (b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n<w:document xmlns:w='
            b'"http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>')
    filler = b"<w:p><w:r><w:t>lol</w:t></w:r></w:p>"
    return _rewrite(good, path, {"word/document.xml": _repeated(head, filler, inflated, b"</w:body></w:document>")})


def _laughs(root: bytes, levels: int = 10) -> bytes:
    """A billion-laughs internal subset for element ``root``: 10 ** ``levels`` "lol"s from a few hundred bytes."""
    lines = [b'<!ENTITY lol0 "lol">']
    lines += [b'<!ENTITY lol%d "%s">' % (n, b"&lol%d;" % (n - 1) * 10) for n in range(1, levels + 1)]
    return b"<!DOCTYPE " + root + b" [\n" + b"\n".join(lines) + b"\n]>\n"


def _with_laughs(xml: bytes, root: bytes, old: bytes, new: bytes) -> list[bytes]:
    """``xml`` with the subset after its declaration and ``old`` replaced by ``new`` (which uses the entities)."""
    declaration, rest = xml.split(b"?>", 1)
    return [declaration + b"?>\n" + _laughs(root) + rest.lstrip().replace(old, new, 1)]


def make_laughs_epub(path: Path) -> Path:
    """A real EPUB whose package document (its title) and chapter use the billion laughs."""
    good = make_good_epub(path.with_name(path.stem + "-seed.epub"))
    with zipfile.ZipFile(good) as book:
        package, chapter = book.read("EPUB/content.opf"), book.read("EPUB/harbour.xhtml")
    return _rewrite(good, path, {
        "EPUB/content.opf": _with_laughs(package, b"package", b"<dc:title>Good Book", b"<dc:title>&lol10;"),
        "EPUB/harbour.xhtml": _with_laughs(chapter, b"html", b"<p>The harbour", b"<p>&lol10; The harbour"),
    })


def make_laughs_docx(path: Path) -> Path:
    """A real DOCX whose ``word/document.xml`` uses the billion laughs in its one run."""
    good = make_good_docx(path.with_name(path.stem + "-seed.docx"))
    with zipfile.ZipFile(good) as document:
        body = document.read("word/document.xml")
    return _rewrite(good, path, {"word/document.xml": _with_laughs(body, b"w:document", b"The ferry", b"&lol10;")})


def make_pdf_bomb(path: Path, inflated: int = 3 * GIB // 8, copies: int = 8) -> Path:
    """A real fpdf2 page whose content is a FlateDecode stream of ``inflated`` bytes of text-showing operators,
    drawn ``copies`` times (one ~1 MB stream object, referenced again and again from the page's ``/Contents``)."""
    pdf = FPDF()
    pdf.add_page()
    pdf.set_font("Helvetica", size=12)
    pdf.cell(0, 10, "Cover page")
    data = bytearray(pdf.output())
    operator = b"BT /F1 12 Tf 72 720 Td (lol) Tj ET\n"
    compressor = zlib.compressobj(9)
    stream = bytearray()
    block = operator * (_CHUNK // len(operator))
    for _ in range(inflated // len(block)):
        stream += compressor.compress(block)
    stream += compressor.flush()
    # An incremental update: the new stream object, the page again with it as its content, and a new xref.
    page_id = _first_page_id(bytes(data))
    page = _object_body(bytes(data), page_id)
    stream_id = _max_object_id(bytes(data)) + 1
    contents = b" ".join(b"%d 0 R" % stream_id for _ in range(copies))
    new_page = _set_contents(page, b"[" + contents + b"]")
    offsets = {}
    offsets[stream_id] = len(data)
    data += b"%d 0 obj\n<< /Length %d /Filter /FlateDecode >>\nstream\n" % (stream_id, len(stream))
    data += stream + b"\nendstream\nendobj\n"
    offsets[page_id] = len(data)
    data += b"%d 0 obj\n" % page_id + new_page + b"\nendobj\n"
    previous = int(bytes(data).rsplit(b"startxref", 1)[1].split()[0])
    root = bytes(data).rsplit(b"/Root", 1)[1].split(b"R", 1)[0] + b"R"
    xref = len(data)
    data += b"xref\n"
    for object_id in sorted(offsets):
        data += b"%d 1\n%010d 00000 n \n" % (object_id, offsets[object_id])
    data += b"trailer\n<< /Size %d /Root%s /Prev %d >>\nstartxref\n%d\n%%%%EOF\n" % (
        stream_id + 1, root, previous, xref)
    path.write_bytes(bytes(data))
    return path


def _first_page_id(data: bytes) -> int:
    at = data.index(b"/Type /Page\n") if b"/Type /Page\n" in data else data.index(b"/Type /Page ")
    header = data.rindex(b" 0 obj", 0, at)
    return int(data[data.rindex(b"\n", 0, header) + 1:header])


def _object_body(data: bytes, object_id: int) -> bytes:
    start = data.index(b"\n%d 0 obj" % object_id) + len(b"\n%d 0 obj" % object_id)
    return data[start:data.index(b"endobj", start)].strip()


def _max_object_id(data: bytes) -> int:
    return max(int(found) for found in re.findall(rb"\n(\d+) 0 obj", data))


def _set_contents(page: bytes, contents: bytes) -> bytes:
    return re.sub(rb"/Contents\s+\d+ 0 R", b"/Contents " + contents, page)


def make_long_docx(path: Path, paragraphs: int = 100_000) -> Path:
    """A real, harmless DOCX of many short paragraphs (~0.3 MB): slow to read (python-docx builds an object per
    paragraph), not big; what a time limit is tested with."""
    good = make_good_docx(path.with_name(path.stem + "-seed.docx"))
    head = (b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n<w:document xmlns:w='
            b'"http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>')

    def body() -> Iterator[bytes]:
        yield head
        for start in range(0, paragraphs, 1000):
            yield b"".join(b"<w:p><w:r><w:t>Paragraph %d of the long report.</w:t></w:r></w:p>" % number
                           for number in range(start, min(start + 1000, paragraphs)))
        yield b"</w:body></w:document>"

    return _rewrite(good, path, {"word/document.xml": body()})


def make_lying_docx(path: Path, inflated: int = 256 << 20, declared: int = 1000) -> Path:
    """A DOCX whose ``word/document.xml`` declares ``declared`` bytes (in its local header and the central
    directory) while its deflate stream inflates to ``inflated``: sizes checked before reading say little of it."""
    source = make_zip_bomb_docx(path.with_name(path.stem + "-full.docx"), inflated)
    data = bytearray(source.read_bytes())
    source.unlink()
    name = b"word/document.xml"
    # (signature, offset of the uncompressed size, offset of the name) in a local header and a central entry.
    for signature, size_at, name_at in ((b"PK\x03\x04", 22, 30), (b"PK\x01\x02", 24, 46)):
        at = data.find(signature)
        while at != -1:
            if data[at + name_at:at + name_at + len(name)] == name:
                data[at + size_at:at + size_at + 4] = declared.to_bytes(4, "little")
            at = data.find(signature, at + 4)
    path.write_bytes(bytes(data))
    return path


BOMBS = {
    "zip-bomb.epub": make_zip_bomb_epub,
    "zip-bomb.docx": make_zip_bomb_docx,
    "laughs.epub": make_laughs_epub,
    "laughs.docx": make_laughs_docx,
    "bomb.pdf": make_pdf_bomb,
}
GOOD = {"good.docx": make_good_docx, "good.epub": make_good_epub}


def read_one(path: Path, before: Path | None) -> dict:
    """Read ``path`` as the app does (``before``: with the ``app`` package in that folder, unboxed, in this
    process) and say what came of it."""
    if before is not None:
        sys.path.insert(0, str(before))  # ahead of the checkout, which ``-m`` puts first
    # Imported here, before the clock starts: with ``before`` the ``app`` package is the one of BEFORE, and
    # app.sizing imports the engine (torch), as the app has.
    from app.documents import read_document

    read_sized = None if before else importlib.import_module("app.sizing").read_sized  # BEFORE's app has none
    started = time.monotonic()
    try:
        if before:
            outcome = f"read, {read_document(path).chars:,} characters"
        else:
            documents, problems = read_sized([str(path)], 1_000_000, "the benchmark's limit")
            outcome = f"read, {documents[0].chars:,} characters" if documents else f"refused: {problems[0]}"
    except BaseException as exc:  # the point is to see what escapes the reader
        outcome = f"{type(exc).__name__}: {str(exc)[:120]}"
    seconds = time.monotonic() - started
    if not before:
        from app.documents import shared_box

        shared_box().close()  # its children are waited for, so RUSAGE_CHILDREN counts them
    return {"outcome": outcome, "seconds": round(seconds, 1),
            "app_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            "child_peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024}


def measure(path: Path, before: Path | None, timeout: float = 400) -> dict:
    """``read_one`` in a fresh Python capped at ``CAP_BYTES`` (``before``: a folder holding the BEFORE ``app``
    package, read unboxed); a run the cap or a signal ends says so."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CAP_BYTES, CAP_BYTES))

    command = [sys.executable, "-m", "benchmarks.app.bombs", "--one", str(path)] + (["--before", str(before)]
                                                                                 if before else [])
    started = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, preexec_fn=cap, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"outcome": f"still reading after {timeout:.0f} s (killed)", "seconds": timeout}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:  # its seconds include starting Python and importing torch (~5 s)
        return {"outcome": f"the process died (exit code {done.returncode})",
                "seconds": round(time.monotonic() - started, 1)}
    return json.loads(lines[-1])


def table(rows: list[tuple[str, int, dict, dict]]) -> str:
    lines = ["| file | on disk | before: outcome | s | app peak MB | after: outcome | s | app peak MB | child peak MB |",
             "|---|---:|---|---:|---:|---|---:|---:|---:|"]
    for name, size, before, after in rows:
        lines.append(f"| {name} | {size / 1e6:.2f} MB | {before['outcome'][:70]} | {before.get('seconds')} | "
                     f"{before.get('app_peak_mb', '-')} | {after['outcome'][:70]} | {after.get('seconds')} | "
                     f"{after.get('app_peak_mb', '-')} | {after.get('child_peak_mb', '-')} |")
    return "\n".join(lines)


def _checkout_before(folder: Path) -> Path:
    """``app/__init__.py`` and ``app/documents`` as of BEFORE, under ``folder`` (git archive; nothing else moves)."""
    folder.mkdir()
    archive = subprocess.run(["git", "archive", BEFORE, "app/__init__.py", "app/documents"], cwd=ROOT,
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one", type=Path, help="read this one file and print the JSON result (internal)")
    parser.add_argument("--before", type=Path, help="with --one: read with the app package in this folder, unboxed")
    parser.add_argument("--skip-before", action="store_true", help="measure only the boxed reads")
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(read_one(args.one, args.before)))
        return
    with tempfile.TemporaryDirectory() as folder:
        old = None if args.skip_before else _checkout_before(Path(folder) / "before")
        rows = []
        for name, make in {**BOMBS, **GOOD}.items():
            path = make(Path(folder) / name)
            before = {"outcome": "(not measured)"} if old is None else measure(path, old)
            after = measure(path, None)
            rows.append((name, path.stat().st_size, before, after))
            print(f"{name}: before {before} after {after}", file=sys.stderr)
    print(table(rows))


if __name__ == "__main__":
    main()

