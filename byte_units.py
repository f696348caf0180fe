"""Sizes and rates as every panel shows them, in one unit family: binary (KiB, MiB, GiB, TiB; MiB/s for rates).

This module imports nothing (no torch, nor the engine), so the engine (``engine.format_bytes`` is this
``format_bytes``), the app and the document reader's child process all say a size the same way.
"""

from __future__ import annotations

GIB = 1 << 30
_UNITS = ("KiB", "MiB", "GiB", "TiB")


def format_bytes(n: int | float | None) -> str:
    """A byte count in binary units, e.g. ``"1.23 GiB"``, ``"512 B"``; ``None`` is ``"n/a"``."""
    if n is None:
        return "n/a"
    sign, value = ("-" if n < 0 else ""), float(abs(n))
    if value < 1024:
        return f"{sign}{int(value)} B"
    for unit in _UNITS:
        value /= 1024
        if round(value, 2) < 1024 or unit == _UNITS[-1]:  # 1,048,575 B is "1.00 MiB", not "1024.00 KiB"
            return f"{sign}{value:.2f} {unit}"
    raise AssertionError("unreachable")


def format_rate(bytes_per_second: float | None) -> str:
    """A transfer rate in the same units, e.g. ``"48.83 MiB/s"``; ``None`` is ``"n/a"``."""
    return "n/a" if bytes_per_second is None else f"{format_bytes(bytes_per_second)}/s"


def in_gib(n: int | float) -> float:
    """``n`` bytes in GiB to two places: a sortable table's number under a "(GiB)" heading."""
    return round(n / GIB, 2)
