"""The read timings file (``read-costs.json``), checked whole before any of it is used.

Estimates are fitted from it at every plan, in handlers: a file with a string for a number, a NaN, a negative time
or a million chunks would raise there (or price a read at ``nan s``). ``checked_file`` returns its reads and rates
only when every field is what ``ReadCosts`` wrote, and raises ``InputError`` saying what is not; the caller then
starts from no measurements (logged), and the next read's timings replace the file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..errors import InputError

FORMAT = 2
KEEP = 24  # reads kept per key
MAX_FILE_BYTES = 16 << 20  # 24 reads x a few hundred chunks x a few dozen keys is well under a MiB
MAX_KEYS = 1024
MAX_CHUNKS = 1 << 16  # a read of 2^31 tokens in 32K-token chunks
MAX_TOKENS = 1 << 31


def checked_file(path: Path) -> tuple[dict[str, list[dict]], dict[str, dict]]:
    """(reads per key, measured rates per key) of the timings file at ``path``; both empty for a file of another
    format. Raises ``OSError`` when it cannot be read and ``InputError`` (a ``ValueError``) when anything in it
    is malformed."""
    with open(path, "rb") as file:
        data = file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise InputError(f"over {MAX_FILE_BYTES >> 20} MiB")
    loaded = json.loads(data, parse_constant=_no_constant)
    if not isinstance(loaded, dict):
        raise InputError("not a JSON object")
    if loaded.get("format") != FORMAT:
        return {}, {}  # an older engine's file: its timings are not comparable
    reads = _mapping(loaded.get("reads"), "reads")
    for key, kept in reads.items():
        if not isinstance(kept, list) or len(kept) > KEEP:
            raise InputError(f"the reads of {key[:60]!r} are not a list of at most {KEEP}")
        for read in kept:
            _read(read)
    rates = _mapping(loaded.get("rates") or {}, "rates")
    for key, rate in rates.items():
        if not isinstance(rate, dict) or not all(_finite(v) and v >= 0 for v in rate.values()):
            raise InputError(f"the rate of {key[:60]!r} is not an object of non-negative numbers")
    return reads, rates


def _read(read) -> None:
    if not isinstance(read, dict) or not _finite(read.get("at", 0.0)):
        raise InputError("a read is not an object with a time")
    chunks = read.get("chunks")
    if not isinstance(chunks, list) or not 0 < len(chunks) <= MAX_CHUNKS:
        raise InputError(f"a read's chunks are not a list of 1 to {MAX_CHUNKS}")
    for chunk in chunks:
        if not isinstance(chunk, list) or len(chunk) != 4 or not all(_finite(v) for v in chunk):
            raise InputError("a chunk is not [position, tokens, seconds, probe seconds]")
        position, tokens, seconds, probe = chunk
        if not (0 <= position <= MAX_TOKENS and 1 <= tokens <= MAX_TOKENS and position == int(position)
                and tokens == int(tokens) and seconds > 0 and probe > 0):
            raise InputError(f"a chunk out of range: {chunk}")


def _mapping(value, name: str) -> dict:
    if not isinstance(value, dict) or len(value) > MAX_KEYS:
        raise InputError(f"{name} is not an object of at most {MAX_KEYS} keys")
    return value


def _finite(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _no_constant(name: str):
    raise InputError(f"{name} is not a measurement")
