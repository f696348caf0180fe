"""CRC-32 (zlib's polynomial and values): ISA-L's where installed, about three times faster, else zlib's."""

from __future__ import annotations

try:
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is in requirements.txt
    from zlib import crc32

__all__ = ["crc32"]
