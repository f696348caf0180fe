"""The lint rules in ``ruff.toml`` hold for the whole tree (``ruff`` comes with requirements-dev.txt)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    ruff = pytest.importorskip("ruff.__main__", reason="ruff is in requirements-dev.txt")
    result = subprocess.run([ruff.find_ruff_bin(), "check", "--no-cache", "--output-format", "concise", "."],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_ruff_configuration_is_the_one_read():
    # A rule set silently ignored (a typo in the file name, a section ruff does not read) would pass the test above.
    ruff = pytest.importorskip("ruff.__main__", reason="ruff is in requirements-dev.txt")
    shown = subprocess.run([ruff.find_ruff_bin(), "check", "--show-settings", "engine/__init__.py"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL).stdout
    assert str(ROOT / "ruff.toml") in shown
    assert sys.version_info >= (3, 11)
