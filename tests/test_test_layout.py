"""The tests' own house rules (issue 52): a helper shared by several test files lives in a helpers/ folder (or a
conftest.py), never in a test module another file imports; and tests/engine/'s folders mirror the engine's wings
(tests/engine/kv/ holds engine/kv/'s tests)."""

from __future__ import annotations

from pathlib import Path

import structure  # tests/helpers/structure.py: imports read from the AST

ROOT = Path(__file__).resolve().parents[1]
# folders under tests/engine that are no wing: the shared helpers and the files tests read (saved snapshots)
NOT_WINGS = {"helpers", "fixtures", "__pycache__"}


def imported_test_modules(root: Path) -> list[str]:
    """``file: module`` for each import, at any depth, of a test module (``test_*``) by a file under ``root/tests``."""
    return [f"{path.relative_to(root)}: {module}" for path in sorted((root / "tests").rglob("*.py"))
            for module, _, _ in structure.imports(root, path) if module.split(".")[-1].startswith("test_")]


def unmirrored(root: Path) -> list[str]:
    """The folders under ``root/tests/engine`` named for no package under ``root/engine``."""
    wings = {path.parent.name for path in (root / "engine").glob("*/__init__.py")}
    return sorted(path.name for path in (root / "tests" / "engine").iterdir()
                  if path.is_dir() and path.name not in NOT_WINGS | wings)


def test_no_test_module_is_imported_as_a_helper():
    # Before: 58 import lines in 44 files imported 19 test modules (test_browser 17 times, test_snapshot 8).
    assert imported_test_modules(ROOT) == []


def test_the_engine_tests_mirror_the_wings():
    assert unmirrored(ROOT) == []


def test_the_rules_see_what_they_guard(tmp_path):
    (tmp_path / "engine" / "kv").mkdir(parents=True)
    (tmp_path / "engine" / "kv" / "__init__.py").write_text("")
    for folder in ("kv", "helpers", "caches"):
        (tmp_path / "tests" / "engine" / folder).mkdir(parents=True)
    (tmp_path / "tests" / "engine" / "kv" / "test_a.py").write_text(
        "from test_b import helper\nimport os\n\ndef test_a():\n    import test_c\n")
    (tmp_path / "tests" / "engine" / "helpers" / "shared.py").write_text("from archs import tiny_configs\n")
    assert imported_test_modules(tmp_path) == ["tests/engine/kv/test_a.py: test_b", "tests/engine/kv/test_a.py: test_c"]
    assert unmirrored(tmp_path) == ["caches"]
