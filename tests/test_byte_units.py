"""``byte_units``: the one formatter of sizes and rates (binary units) that the engine, the app and the document
reader's child all use (issue 51: a screen said MiB beside MB); it imports neither torch nor the engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from byte_units import format_bytes, format_rate, in_gib

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("n", "text"),
    [(None, "n/a"), (0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"),
     (5 * 2**20, "5.00 MiB"), (int(1.23 * 2**30), "1.23 GiB"), (3 * 2**40, "3.00 TiB"),
     (2**50, "1024.00 TiB"), (-2048, "-2.00 KiB"), (2**20 - 1, "1.00 MiB"), (2**30 - 2**10, "1.00 GiB"),
     (1.1e9, "1.02 GiB")],
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text


def test_rates_and_table_numbers_are_in_the_same_units():
    assert format_rate(50 * 2**20) == "50.00 MiB/s"
    assert format_rate(2.5 * 2**30) == "2.50 GiB/s"
    assert format_rate(None) == "n/a"
    assert in_gib(1.1e9) == 1.02 and in_gib(3 * 2**30) == 3.0


def test_the_engine_says_sizes_with_this_formatter():
    import engine

    assert engine.format_bytes is format_bytes  # one formatter: the engine's messages and the page's agree


def test_it_imports_neither_torch_nor_the_engine():
    # The document reader's child process imports no engine and no torch (app/documents/sandbox.py).
    code = "import sys, byte_units; print(sorted(m for m in ('torch', 'engine', 'app') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
