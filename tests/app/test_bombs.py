"""Untrusted files in a box: zip and entity bombs refused before they inflate, a PDF bomb stopped by the reading
child's memory limit, slow files by its time limit, each with its own message while the rest of the set reads.

The bombs are real files (zipfile, ebooklib, python-docx, fpdf2 via benchmarks/app/bombs.py), ~1 MB each, inflating to
hundreds of megabytes or gigabytes; the set is read in a fresh Python capped at 3 GiB of address space.
"""

from __future__ import annotations

import html
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from app.documents import Box, DocumentError, read_document, sandbox
from app.documents.archive import check_zip
from app.documents.limits import MAX_MEMBERS, MAX_TEXT_CHARS, BoxLimits
from app.documents.text import normalise
from app.sizing import read_sized
from benchmarks.app.bombs import (
    make_good_docx,
    make_good_epub,
    make_laughs_docx,
    make_laughs_epub,
    make_long_docx,
    make_lying_docx,
    make_pdf_bomb,
    make_zip_bomb_docx,
    make_zip_bomb_epub,
)

ROOT = Path(__file__).resolve().parents[2]
CAP = 3 << 30

# Reads the set given on the command line as the app does, in a process capped at 3 GiB like the app's
# test machine; prints what came back and the peaks of this process and of its (waited-for) children.
_READ_THE_SET = """
import json, resource, sys, time
from app.documents import shared_box
from app.sizing import read_sized
started = time.monotonic()
documents, problems = read_sized(sys.argv[1:], 1_000_000, "the test's limit")
seconds = time.monotonic() - started
shared_box().close()
print(json.dumps({"documents": {d.name: d.text for d in documents}, "problems": problems, "seconds": seconds,
                  "app_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10,
                  "child_peak": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss << 10}))
"""


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bombs")
    return {name: make(folder / name) for name, make in (
        ("zip-bomb.epub", make_zip_bomb_epub), ("zip-bomb.docx", make_zip_bomb_docx),
        ("laughs.epub", make_laughs_epub), ("laughs.docx", make_laughs_docx), ("bomb.pdf", make_pdf_bomb),
        ("good.epub", make_good_epub))}


def test_every_bomb_is_refused_on_its_own_within_60_s_under_3_gib_and_the_good_file_reads(bombs):
    assert all(path.stat().st_size < 1.3e6 for path in bombs.values())  # ~1 MB each, on disk
    done = subprocess.run([sys.executable, "-c", _READ_THE_SET, *map(str, bombs.values())], cwd=ROOT,
                          capture_output=True, text=True, timeout=180, preexec_fn=_capped)
    assert done.returncode == 0, done.stderr[-3000:]  # before the box: SIGABRT in PDFium at the cap
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["seconds"] < 60, result["seconds"]
    assert list(result["documents"]) == ["good.epub"]
    assert "tide tables in a blue tin" in result["documents"]["good.epub"]
    problems = dict(zip(["zip-bomb.epub", "zip-bomb.docx", "laughs.epub", "laughs.docx", "bomb.pdf"],
                        result["problems"]))
    assert len(result["problems"]) == 5
    for name, problem in problems.items():
        assert problem.startswith(name), problem  # each message names its own file
    assert "inflates 515 times" in problems["zip-bomb.epub"] and "zip bomb" in problems["zip-bomb.epub"]
    assert "zip bomb" in problems["zip-bomb.docx"]
    assert "billion laughs" in problems["laughs.epub"] and "billion laughs" in problems["laughs.docx"]
    assert "more memory than one file may take to read (2.00 GiB)" in problems["bomb.pdf"]  # was "2.0 GB": of 2 GiB
    # The app's process holds its imports (torch included) and no file; the PDF's child stopped at its cap.
    assert result["app_peak"] < 1 << 30, result["app_peak"]
    assert result["child_peak"] < BoxLimits().memory_bytes + (100 << 20), result["child_peak"]


@pytest.mark.slow
def test_the_upload_handler_names_each_bad_file_and_reads_the_good_one(embedded_model, bombs, secret_pdf):
    # Before: the billion-laughs DOCX escaped the handler as lxml's XMLSyntaxError, a bare "Error" for the set.
    from app.browser_state import BrowserState
    from app.handlers import Handlers
    from engine import DocumentSession, OffloadPolicy

    model, tokenizer = embedded_model
    handlers = Handlers(lambda: DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=16)))
    state = BrowserState()
    files = [str(bombs["laughs.docx"]), str(bombs["zip-bomb.epub"]), secret_pdf]
    with pytest.warns(UserWarning, match="Skipped"):
        view = handlers.choose_files(files, state)
    assert [doc.name for doc in state.documents] == ["lighthouse.pdf"]
    status = html.unescape(re.sub(r"<[^>]+>", "", str(view.status)))
    assert "laughs.docx is refused" in status and "billion laughs" in status
    assert "zip-bomb.epub is refused" in status and "zip bomb" in status
    assert "Ready to read" in status


def test_zip_sizes_are_checked_before_anything_is_inflated(bombs, tmp_path):
    started = time.monotonic()
    for name in ("zip-bomb.epub", "zip-bomb.docx"):
        # Its size in the meters' units (issue 51; before: "(to 2.6 GB; ...", decimal units beside MiB and GiB).
        with pytest.raises(DocumentError, match=rf"^{name} is refused: its part .* inflates \d+ times "
                                                r"\(to \d+\.\d\d (MiB|GiB);"):
            read_document(bombs[name])  # in this process: the check alone stands between it and 3 GB
    assert time.monotonic() - started < 5  # unchecked, these took 36 s and 19 s at 2.6 GB (docs/benchmarks/bombs.md)
    crowded = tmp_path / "crowded.docx"
    with zipfile.ZipFile(make_good_docx(tmp_path / "seed.docx")) as good, zipfile.ZipFile(crowded, "w") as out:
        for info in good.infolist():
            out.writestr(info, good.read(info))
        for number in range(MAX_MEMBERS):
            out.writestr(f"media/{number}.txt", b"")
    with pytest.raises(DocumentError, match=f"holds {MAX_MEMBERS + len(good.infolist()):,} files"):
        check_zip(crowded, "crowded.docx", "a Word document")


def test_a_member_inflating_past_its_declared_size_is_cut_there_and_refused(tmp_path):
    lying = make_lying_docx(tmp_path / "lying.docx")  # declares 1,000 bytes, holds 256 MiB
    check_zip(lying, "lying.docx", "a Word document")  # its declared sizes are fine...
    out = bytearray()
    with zipfile.ZipFile(lying) as archive, archive.open("word/document.xml") as member:
        with pytest.raises(zipfile.BadZipFile, match="Bad CRC-32"):
            while chunk := member.read(100):
                out += chunk
    assert len(out) <= 1000  # ...and nothing past them comes out: zipfile stops there, and refuses it
    with pytest.raises(DocumentError, match="^lying.docx could not be read"):
        read_document(lying)
    documents, problems = read_sized([str(lying)], 1_000_000, "reason")
    assert documents == [] and problems[0].startswith("lying.docx could not be read")


def test_billion_laughs_get_their_own_message_not_a_parser_error(bombs):
    # Before: ebooklib raised TypeError and python-docx lxml's XMLSyntaxError, out of the handler ("Error").
    with pytest.raises(DocumentError, match=r"^laughs.epub is refused: its part 'EPUB/content.opf' defines XML "
                                            r"entities out of other entities"):
        read_document(bombs["laughs.epub"])
    with pytest.raises(DocumentError, match=r"^laughs.docx is refused: its part 'word/document.xml' defines"):
        read_document(bombs["laughs.docx"])


def test_a_plain_entity_declaration_is_not_a_bomb(tmp_path):
    plain = tmp_path / "plain.docx"
    with zipfile.ZipFile(make_good_docx(tmp_path / "seed.docx")) as good, zipfile.ZipFile(plain, "w") as out:
        for info in good.infolist():
            body = good.read(info)
            if info.filename == "word/document.xml":
                body = body.replace(b"?>", b'?>\n<!DOCTYPE w:document [<!ENTITY nbsp "&#160;">]>', 1)
            out.writestr(info, body)
    check_zip(plain, "plain.docx", "a Word document")


def test_a_slow_file_is_stopped_at_the_time_limit_even_without_resource(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "HAS_RESOURCE", False)  # as on Windows: no memory limit, the time limit holds
    slow = make_long_docx(tmp_path / "long.docx")  # 100,000 paragraphs: ~10 s of python-docx
    good = make_good_docx(tmp_path / "good.docx")
    box = Box(BoxLimits(seconds=1, wall_seconds=40))  # 1 s of the reader's processor time, even on a busy machine
    try:
        started = time.monotonic()
        with pytest.raises(DocumentError, match=r"^long.docx took longer than 1 s to read, so it was stopped"):
            box.extract(slow, "long.docx")
        assert time.monotonic() - started < 40
        assert "pier four" in box.extract(good, "good.docx").text  # a fresh child reads the next file
    finally:
        box.close()


def test_a_reader_starved_by_a_busy_machine_says_so_and_not_that_the_file_stalls_it(tmp_path):
    """The limit counts the reader's processor time: a reader given none (stopped, as a machine busy with other
    work all but stops it) is ended at the clock's limit, saying the machine was busy."""
    good = make_good_docx(tmp_path / "good.docx")
    box = Box()  # the default limits while a reader starts and reads: a loaded machine starts one in more than 3 s
    try:
        assert "pier four" in box.extract(good, "good.docx").text
        reader = box._idle[0]._process.pid
        box.limits = BoxLimits(seconds=1, wall_seconds=3)
        os.kill(reader, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(DocumentError) as refused:
            box.extract(good, "good.docx")
        assert refused.value.args[0].startswith("good.docx could not be read now: the machine is too busy (its "
                                                "reader had 0 s of processor time in ")
        assert "stall" not in str(refused.value)
        assert 3 <= time.monotonic() - started < 30  # the clock's limit: a stopped reader burns no processor time
        box.limits = BoxLimits()
        assert "pier four" in box.extract(good, "good.docx").text  # a fresh child reads the next file
        assert box._idle[0]._process.pid != reader
    finally:
        box.close()


def test_text_past_what_any_model_reads_is_cut_with_a_note(tmp_path):
    big = tmp_path / "big.txt"
    line = "The tide comes in twice a day.\n"
    big.write_text(line * (MAX_TEXT_CHARS // len(line) + 1000))
    documents, problems = read_sized([str(big)], 1_100_000, "reason")
    assert documents[0].chars <= MAX_TEXT_CHARS
    assert problems == [f"big.txt: the text after its first {MAX_TEXT_CHARS:,} characters (of "
                        f"{len(line) * (MAX_TEXT_CHARS // len(line) + 1000) - 1:,}), more than any model here "
                        "can read."]


def test_trailing_spaces_are_stripped_in_linear_time():
    started = time.monotonic()
    assert normalise("a" + " " * 200_000 + "x \n y") == "a" + " " * 200_000 + "x\n y"
    assert time.monotonic() - started < 1  # the regex it replaces took 6 s for 20,000 spaces (quadratic)
