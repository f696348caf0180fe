"""The engine's layering, checked on its source: lower layers take what they need as arguments."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "engine"
SNAPSHOT_MODULES = sorted((ENGINE / "store").glob("*.py"))  # (engine/snapshot*.py before the move into store/)


@pytest.mark.parametrize("path", SNAPSHOT_MODULES, ids=lambda p: p.name)
def test_snapshot_code_neither_imports_the_session_nor_reads_private_fields(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            assert module not in (".session", "engine.session"), f"{path.name}:{node.lineno} imports the session"
            assert not (module == "." and any(a.name == "session" for a in node.names)), path.name
        elif isinstance(node, ast.Import):
            assert all(a.name != "engine.session" for a in node.names), path.name
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            assert owner in ("self", "cls", "snapshot_io", None) or owner[0].isupper(), (
                f"{path.name}:{node.lineno} reads {owner}.{node.attr}, another object's private field")


def test_the_store_modules_are_found():
    # (an empty list skips the check above without a word: what the glob of the old engine/snapshot*.py became)
    assert {"files.py", "format.py", "snapshots.py", "checkpoint.py"} <= {path.name for path in SNAPSHOT_MODULES}
