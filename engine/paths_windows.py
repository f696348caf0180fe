"""Windows' rules, and the switch that forces them on Linux: ``HEADINFER_WINDOWS_SHAPED=1``.

Most 4090s are in Windows PCs, and CI is Linux. The switch turns on together every choice a Windows PC makes:
``spawn`` for child processes and a pin limit (``HEADINFER_PIN_LIMIT``, 64 MiB unless set), both at a process's
start by ``process_env.prepare_process()``; and, where ``windows_rules()`` is read, no C compiler (the torch paths:
``engine.native.library.compiler``), no hard links (snapshots copy the disk tier's files), names valid on NTFS
(``ntfs_name``) and the portable fallbacks of POSIX-only calls (space reservation, locks, memory caps). On a real Windows PC ``windows_rules()`` is true without the switch.
Imports nothing of the engine, like ``paths``: every wing (``kv/``, ``native/``) may use it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re

logger = logging.getLogger(__name__)

ENV = "HEADINFER_WINDOWS_SHAPED"
MAX_NAME = 120  # characters in one name we make: NTFS allows 255 UTF-16 units; suffixes (-bf16-<key>) need room

# Reserved device names: with any extension ("con.txt") and trailing spaces, in any case. COM¹-³/LPT¹-³ too.
_RESERVED = {"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$",
             *(f"{port}{n}" for port in ("COM", "LPT") for n in [*"123456789", "\u00b9", "\u00b2", "\u00b3"])}
_INVALID = re.compile(r'[<>:"/\\|?*\x00-\x1f]')


def windows_shaped() -> bool:
    """Whether ``HEADINFER_WINDOWS_SHAPED=1`` asks this (Linux) process to make Windows' choices."""
    return os.environ.get(ENV, "").strip() == "1"


def windows_rules() -> bool:
    """Whether Windows' rules hold here: on Windows, or Windows-shaped."""
    return os.name == "nt" or windows_shaped()


def ntfs_name(name: str, *, max_length: int = MAX_NAME) -> str:
    """``name`` made a valid file or folder name on NTFS (and unchanged where it is one already, so Linux keeps its
    names): ``<>:"/\\|?*`` and control characters become ``_``, trailing dots and spaces go, a reserved device
    name (``CON``, ``nul.txt``, ``COM1``) gets a leading ``_``, and a name past ``max_length`` is cut with a hash
    of the whole kept, so two long names stay apart."""
    cleaned = _INVALID.sub("_", name).rstrip(". ") or "_"
    if cleaned.split(".", 1)[0].rstrip(" ").upper() in _RESERVED:
        cleaned = f"_{cleaned}"
    if len(cleaned) > max_length:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        cleaned = f"{cleaned[:max_length - 9].rstrip('. ')}-{digest}"
    return cleaned


def is_ntfs_name(name: str) -> bool:
    """Whether ``name`` is a name NTFS (through Win32) accepts as it is."""
    return bool(name) and ntfs_name(name, max_length=255) == name
