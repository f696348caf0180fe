"""The page's upload check (``app/upload_check.js``) says sizes as ``byte_units.format_bytes`` does, digit for digit:
its refusal sits in the status line beside the server's messages and the meters (issue 51: "1,024 MiB" there,
"1.00 GiB" here). Its ``size`` function, run in Chromium, against the Python one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from chromium import chromium_page

from byte_units import format_bytes

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "app" / "upload_check.js"
SIZES = [0, 1, 1023, 1024, 1536, 10**6, 2**20 - 1, 2**20, 5 * 2**20 + 123, 210 * 10**6, 256 * 2**20, 2**30 - 1,
         2**30, 1.5 * 2**30, 16 * 10**9, 3 * 2**40, 2**50]


def test_the_upload_checks_sizes_are_format_bytes_sizes():
    source = re.search(r"const size = \(n\) => \{.*?\n  \};", SCRIPT.read_text(), re.S)
    assert source, "upload_check.js defines no size(n)"
    with chromium_page("about:blank") as page:
        shown = page.evaluate(f"(sizes) => {{ {source.group(0)} return sizes.map(size); }}", SIZES)
    assert shown == [format_bytes(n) for n in SIZES]
