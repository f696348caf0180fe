"""The app layer's rules, checked on its source: no torch (only the engine's API), no prints."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "app"


@pytest.mark.parametrize("path", sorted(APP.rglob("*.py")), ids=lambda p: str(p.relative_to(APP)))
def test_app_module_imports_no_torch_and_does_not_print(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not any(alias.name.split(".")[0] == "torch" for alias in node.names), path.name
        elif isinstance(node, ast.ImportFrom):
            assert (node.module or "").split(".")[0] != "torch", path.name
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id != "print", f"{path.name}:{node.lineno} prints; log instead"
