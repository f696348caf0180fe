"""Bytes of a text file to ``str``: encoding detection, and binary files refused.

A binary file renamed ``.txt`` would otherwise decode as latin-1 into thousands of tokens of
noise; it is refused with a message naming what it looks like.
"""

from __future__ import annotations

import codecs
import logging
import re

from app.documents.document import DocumentError

logger = logging.getLogger(__name__)

# Legacy single-byte fallbacks, in order. cp1252 first because Western books saved on Windows
# are by far the most common non-UTF-8 text; latin-1 decodes any byte so it always ends the chain.
# charset_normalizer is deliberately not used: on short Western text it guesses cp1250 and
# turns "très" into "trčs".
_FALLBACK_ENCODINGS = ("cp1252", "latin-1")

# C0 control bytes no text file contains; tab, line feed, carriage return, form feed, vertical
# tab, escape (ANSI colours in logs) and Ctrl-Z (the DOS end of file) are text.
_CONTROL_BYTES = bytes(byte for byte in range(32) if byte not in b"\t\n\r\f\v\x1b\x1a")
_CONTROL_CHARS = re.compile("[" + re.escape(_CONTROL_BYTES.decode("ascii")) + "\x7f]")
_MAX_CONTROL_SHARE = 0.01  # random or compressed bytes: ~11%; real text: 0
_SAMPLES, _SAMPLE_BYTES = 8, 512 << 10

# File signatures (first bytes) of formats users might rename by mistake, with their names; none
# is how a text begins (bzip2's "BZh" could be: its data is caught as binary anyway).
_SIGNATURES = (
    (b"%PDF-", "a PDF document (rename it to .pdf)"),
    (b"PK\x03\x04", "a ZIP archive (an EPUB or Word .docx file is one: give it its real extension)"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "an old Microsoft Office file (save it as .docx or PDF)"),
    (b"\x7fELF", "a program (ELF executable)"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"\xfd7zXZ\x00", "an xz archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"Rar!\x1a\x07", "a RAR archive"),
    (b"SQLite format 3\x00", "an SQLite database"),
)  # fmt: skip


def decode_text(data: bytes, name: str) -> str:
    """Decode a text file: UTF-8 (with or without BOM), UTF-16, then cp1252 and latin-1.

    Raises:
        DocumentError: the bytes are not text (a known binary signature, NUL bytes or many
            control characters).
    """
    _refuse_signatures(data, name)
    text = _decode_utf16(data)
    if text is None:
        refuse_binary(data, name)
        text = _decode_8bit(data)
    if _control_share(text) > _MAX_CONTROL_SHARE:
        raise _binary_error(name, "it contains binary data")
    return text


def refuse_binary(data: bytes, name: str) -> None:
    """Raise :class:`DocumentError` when ``data`` (an 8-bit or UTF-8 text format) is binary."""
    _refuse_signatures(data, name)
    if _control_share_bytes(data) > _MAX_CONTROL_SHARE:
        raise _binary_error(name, "it contains binary data")


def _refuse_signatures(data: bytes, name: str) -> None:
    for signature, what in _SIGNATURES:
        if data.startswith(signature):
            raise _binary_error(name, f"it looks like {what}")


def _binary_error(name: str, why: str) -> DocumentError:
    return DocumentError(
        f"{name} is not a text file: {why}. Upload the original document, or save it as "
        "plain text (UTF-8) first."
    )


def _decode_utf16(data: bytes) -> str | None:
    # Notepad's "Unicode" is UTF-16 with a BOM; without one, NULs on one byte parity betray it.
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        encodings = ("utf-16",)
    elif len(data) >= 4 and len(data) % 2 == 0 and data.count(0) >= len(data) // 4:
        encodings = ("utf-16-le",) if data[1::2].count(0) > data[0::2].count(0) else ("utf-16-be",)
    else:
        return None
    for encoding in encodings:
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:
            pass
    return None


def _decode_8bit(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    for encoding in _FALLBACK_ENCODINGS:
        try:
            text = data.decode(encoding)
        except UnicodeDecodeError:
            continue
        logger.info("text is not UTF-8; decoded as %s", encoding)
        return text
    raise AssertionError("latin-1 decodes every byte string")  # pragma: no cover


def _control_share_bytes(data: bytes) -> float:
    # Large files are judged on 8 evenly spaced samples of 512 KiB: binary data is binary
    # throughout, and a 200 MB upload costs no copy of itself.
    if len(data) > _SAMPLES * _SAMPLE_BYTES:
        step = (len(data) - _SAMPLE_BYTES) // (_SAMPLES - 1)
        data = b"".join(data[i * step : i * step + _SAMPLE_BYTES] for i in range(_SAMPLES))
    return (len(data) - len(data.translate(None, _CONTROL_BYTES))) / max(len(data), 1)


def _control_share(text: str) -> float:
    return sum(1 for _ in _CONTROL_CHARS.finditer(text, 0, 1 << 20)) / max(min(len(text), 1 << 20), 1)


def normalise(text: str) -> str:
    """Unix line ends, no trailing spaces, at most one blank line between paragraphs."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    # Per line, not a ``[ \t]+$`` regex: that one backtracks over every run of spaces not at a line end, quadratic
    # in its length (a 100 KB line of spaces held the upload for minutes).
    text = "\n".join(line.rstrip(" \t\f\v") for line in text.split("\n"))
    # At most one blank line between paragraphs: extra blank lines only cost tokens.
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()
