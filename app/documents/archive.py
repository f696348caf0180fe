"""EPUB and DOCX files are zip archives: their sizes are checked from the central directory before anything is
inflated, so a zip bomb is refused in milliseconds instead of filling memory.

What a member holds past its declared size never reaches a reader: CPython's ``zipfile`` cuts each member at the
size the central directory declares and then refuses it on its CRC (tests/app/test_bombs.py
holds it), so checking the declared sizes bounds what is inflated.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from app.documents.document import DocumentError
from app.documents.limits import MAX_MEMBERS, MAX_RATIO, MAX_UNPACKED_BYTES, RATIO_FROM_BYTES
from byte_units import format_bytes  # the meters' units; torch-free, as the reading child is

format_size = format_bytes  # sandbox.py's name for it: the one formatter, not a second


def check_zip(path: Path, name: str, what: str) -> None:
    """Refuse ``path`` (an EPUB or DOCX, ``what``) when its members are too many, inflate too far in all, or one
    of them packs more than ``MAX_RATIO`` to one; a file that is no zip at all is left to its reader to name.

    Raises:
        DocumentError: with the number that is over and its limit.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return  # the reader says it is damaged, in its own words
    if len(members) > MAX_MEMBERS:
        raise _refused(name, what, f"it holds {len(members):,} files (at most {MAX_MEMBERS:,} are read)")
    unpacked = sum(member.file_size for member in members)
    if unpacked > MAX_UNPACKED_BYTES:
        raise _refused(name, what, f"it unpacks to {format_bytes(unpacked)} "
                                   f"(at most {format_bytes(MAX_UNPACKED_BYTES)} are read)")
    for member in members:
        ratio = member.file_size / max(member.compress_size, 1)
        if member.file_size > RATIO_FROM_BYTES and ratio > MAX_RATIO:
            raise _refused(name, what, f"its part {member.filename[:80]!r} inflates {ratio:,.0f} times "
                                       f"(to {format_bytes(member.file_size)}; real documents pack under "
                                       f"{MAX_RATIO} times), the mark of a zip bomb")
    if (part := _nested_entities(path, members)) is not None:
        raise _refused(name, what, f"its part {part[:80]!r} defines XML entities out of other entities, the mark "
                                   "of an entity-expansion (\"billion laughs\") bomb")


def _nested_entities(path: Path, members: list[zipfile.ZipInfo]) -> str | None:
    """The first XML member whose prolog declares an entity that uses another entity (how a billion-laughs file
    grows; a plain ``<!ENTITY nbsp "&#160;">``, which some e-books declare, is left alone), else None."""
    with zipfile.ZipFile(path) as archive:
        for member in members:
            if not member.filename.lower().endswith(_XML_SUFFIXES) or member.is_dir():
                continue
            try:
                with archive.open(member) as stream:
                    head = stream.read(PROLOG_BYTES)
            except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError):
                continue  # the reader reports a damaged part
            if head.startswith((b"\xff\xfe", b"\xfe\xff")) or head[1:2] == b"\x00" or head[:1] == b"\x00":
                head = head.decode("utf-16", "replace").encode("utf-8", "replace")
            if _NESTED_ENTITY.search(head):
                return member.filename
    return None


_XML_SUFFIXES = (".xml", ".xhtml", ".html", ".htm", ".opf", ".ncx", ".rels", ".svg", ".smil")
# The prolog (where a DOCTYPE's entities are declared) is read this far into each XML part.
PROLOG_BYTES = 256 << 10
# <!ENTITY name "... &other; ...">: a value that refers to another entity (not a character reference, &#160;).
_NESTED_ENTITY = re.compile(rb"""<!ENTITY\s+(?:%\s+)?[^\s"']+\s+(?:"[^"]*&[^#"][^"]*"|'[^']*&[^#'][^']*')""")


def _refused(name: str, what: str, why: str) -> DocumentError:
    return DocumentError(f"{name} is refused: {why}. It is not read as {what}; if it is a real document, "
                         "save it as PDF or plain text and upload that.")
