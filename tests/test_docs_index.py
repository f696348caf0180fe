"""docs/benchmarks stays navigable (issue 52): only reports at its top, each named in the README's index; the data
they are made from in ``data/``, GPU runs in ``runs/<date>/``; every file a report links or names in backticks
exists, and none points outside the repo."""

from __future__ import annotations

import re
from pathlib import Path

from doc_links import CODE_PATH, LINK, unresolved  # tests/helpers/doc_links.py: the docs' one link checker

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks"

# a file named in backticks as a path (`data/x.json`, `runs/2026-11-27/gpu.md`): no spaces, braces, $ or ~
_NAMED = re.compile(r"`(\w[\w./-]*\.(?:json|jsonl|md|png|log|txt))`")


def index_section(readme: Path) -> str:
    text = readme.read_text(encoding="utf-8")
    match = re.search(r"^## Index\n(.*)", text, re.S | re.M)
    assert match, f"{readme} has no '## Index' section"
    return match.group(1)


def unindexed(folder: Path) -> list[str]:
    """The reports at the top of ``folder`` that its README's index does not link."""
    linked = {(folder / target.split("#", 1)[0]).resolve() for target in LINK.findall(index_section(folder / "README.md"))}
    return sorted(p.name for p in folder.glob("*.md") if p.name != "README.md" and p.resolve() not in linked)


def data_at_top(folder: Path) -> list[str]:
    """Entries at the top of ``folder`` that are neither a report nor the ``data``/``runs`` folders."""
    return sorted(p.name for p in folder.iterdir()
                  if not (p.is_file() and p.suffix == ".md") and p.name not in {"data", "runs"})


def missing_references(doc: Path, root: Path = ROOT) -> list[str]:
    """Links, backticked file names and code paths in ``doc`` that are no file inside ``root``: read from the doc's
    folder, or from the repo's root (``benchmarks/x.py``, ``docs/...``)."""
    text = doc.read_text(encoding="utf-8")
    return unresolved(doc, LINK.findall(text) + _NAMED.findall(text) + CODE_PATH.findall(text), root, from_root=True)


def test_every_report_at_the_top_is_in_the_index():
    assert unindexed(DOCS) == []


def test_no_data_file_sits_at_the_top():
    assert data_at_top(DOCS) == []
    assert [p.name for p in (DOCS / "runs").iterdir() if not re.fullmatch(r"\d{4}-\d\d-\d\d\w*", p.name)] == []


def test_every_file_a_report_names_exists_and_none_points_outside():
    broken = {str(doc.relative_to(DOCS)): missing for doc in sorted(DOCS.rglob("*.md"))
              if (missing := missing_references(doc))}
    assert broken == {}
    outside = [str(doc.relative_to(DOCS)) for doc in DOCS.rglob("*.md") if "shared/" in doc.read_text(encoding="utf-8")]
    assert outside == []


def test_the_checks_catch_what_they_guard(tmp_path):
    # a report left out of the index, a data file at the top, a link to a moved file: each is found
    (tmp_path / "README.md").write_text("# B\n\n[a.md](a.md) above the index\n\n## Index\n\n[b.md](b.md)\n")
    for name in ("a.md", "b.md"):
        (tmp_path / name).write_text(f"# {name}\n\nRecords: `data/{name[0]}.json`, [plot](data/{name[0]}.png); code:"
                                     f" `engine/{name[0]}.py`, `tests/test_{name[0]}.py::test_it`.\n")
    (tmp_path / "a.json").write_text("[]")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "b.json").write_text("[]")
    assert unindexed(tmp_path) == ["a.md"]
    assert data_at_top(tmp_path) == ["a.json"]
    (tmp_path / "engine").mkdir()  # the repo's code (here the root is both the repo and the reports' folder)
    (tmp_path / "engine" / "b.py").write_text("")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_b.py").write_text("")
    assert missing_references(tmp_path / "a.md", tmp_path) == [  # links first, then names, then code
        "data/a.png", "data/a.json", "engine/a.py", "tests/test_a.py"]
    assert missing_references(tmp_path / "b.md", tmp_path) == ["data/b.png"]
