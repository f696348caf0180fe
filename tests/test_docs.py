"""The README stays a front door and the docs' references hold: the README at most ``README_MAX_LINES`` lines, every
relative link in it and in ``docs/*.md`` a file of the repo, every repo path it names in backticks there, its test
command the one CI runs, and its Python example importing names that exist."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest
from doc_links import broken_links, missing_code_paths, prose  # tests/helpers/doc_links.py: the docs' one link checker

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 150

_BACKTICKED = re.compile(r"`([^`\s]+)`")
# a module's attribute named by the module's repo path (`engine/cpu/int8_matmul.gemv`): renamed code leaves it behind
_CODE_ATTRIBUTE = re.compile(r"`((?:app|benchmarks|engine|scripts|tests)/[\w/]+)\.([A-Za-z_]\w*)`")


def missing_named_paths(doc: Path, root: Path = ROOT) -> list[str]:
    """Backticked repo paths in ``doc`` (those starting with a top-level file or folder of ``root``, such as
    ``docs/...`` or ``scripts/test.sh``) that do not exist; Hub ids, home-folder paths and the like are not repo
    paths and are left alone."""
    tops = {entry.name for entry in root.iterdir() if not entry.name.startswith(".") or entry.name == ".ci"}
    missing = []
    for name in _BACKTICKED.findall(prose(doc.read_text(encoding="utf-8"))):
        path = name.rstrip("/.,:;")
        if path.split("/", 1)[0] in tops and ("/" in path or "." in path) and not (root / path).exists():
            missing.append(name)
    return missing


def missing_code_attributes(doc: Path) -> list[str]:
    """Backticked ``module/path.attribute`` references in ``doc``'s prose whose module (``module/path.py`` or a
    package) is not there or does not define or import ``attribute``; ``x.py``, ``x.c`` and the like are files."""
    missing = []
    for path, attribute in _CODE_ATTRIBUTE.findall(prose(doc.read_text(encoding="utf-8"))):
        if attribute in ("py", "c", "h", "sh", "md", "json", "txt", "so", "toml", "yml", "yaml", "cfg"):
            continue
        names = _module_names(path.replace("/", "."))
        if names is not None and attribute not in names:
            missing.append(f"{path}.{attribute}")
    return missing


def _section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def _code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def readme_test_command() -> str:
    """The one command of the README's first bash block under '## Run the tests'."""
    blocks = _code_blocks(_section(README.read_text(encoding="utf-8"), "Run the tests"), "bash")
    assert blocks, "no bash block under '## Run the tests'"
    lines = [line for line in blocks[0].splitlines() if line.strip()]
    assert len(lines) == 1, f"the test block should hold one command, not {lines}"
    return lines[0].strip()


def ci_commands() -> list[str]:
    """The commands ``.ci/run`` runs (not its comments, shell options or ``cd``)."""
    lines = (line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith(("#", "set ", "cd "))]


def _module_names(module: str) -> set[str] | None:
    """The names a repo module (``x.py`` or package ``x/__init__.py`` at the top) defines or imports; None when the
    module is not the repo's (torch, transformers)."""
    parts = module.split(".")
    found = [path for path in (ROOT.joinpath(*parts).with_suffix(".py"), ROOT.joinpath(*parts, "__init__.py"))
             if path.is_file()]
    if not found:
        ours = (ROOT / parts[0]).is_dir() or (ROOT / f"{parts[0]}.py").is_file()
        return set() if ours else None  # a module of ours that is not there defines nothing
    path, names = found[0], set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
    return names


def engine_public_names() -> list[str]:
    tree = ast.parse((ROOT / "engine" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError("engine/__init__.py has no __all__")


def test_the_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md is {lines} lines, over {README_MAX_LINES}: move detail to docs/"


@pytest.mark.parametrize("doc", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_every_relative_link_resolves(doc):
    assert broken_links(doc, ROOT) == []


def test_every_repo_path_the_readme_names_exists():
    assert missing_named_paths(README) == []


@pytest.mark.parametrize("doc", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_every_code_path_a_doc_names_exists(doc):
    assert missing_code_paths(doc, ROOT) == []


@pytest.mark.parametrize("doc", [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "benchmarks")
                                 .glob("*.md"))], ids=lambda p: p.name)
def test_every_code_attribute_a_doc_names_exists(doc):
    assert missing_code_attributes(doc) == []


def test_the_readme_test_command_is_the_one_ci_runs():
    command = readme_test_command()
    assert command in ci_commands(), f"README's {command!r} is not what .ci/run runs ({ci_commands()})"
    assert (ROOT / shlex.split(command)[0]).is_file()


def test_the_readme_python_example_imports_names_that_exist():
    blocks = _code_blocks(_section(README.read_text(encoding="utf-8"), "Use the engine from Python"), "python")
    assert blocks, "no python block under '## Use the engine from Python'"
    imports = [node for node in ast.walk(ast.parse(blocks[0])) if isinstance(node, ast.ImportFrom)]
    assert imports
    for node in imports:
        defined = _module_names(node.module)
        if defined is not None:
            missing = [alias.name for alias in node.names if alias.name not in defined]
            assert not missing, f"README: `from {node.module} import {', '.join(missing)}`: not defined there"
        if node.module == "engine":
            assert {alias.name for alias in node.names} <= set(engine_public_names())


def test_the_readme_counts_engines_public_names():
    stated = re.findall(r"`engine\.__all__` \((\d+) names\)", README.read_text(encoding="utf-8"))
    assert stated == [str(len(engine_public_names()))]


# The checks themselves fail on what they exist to catch.

def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "there.md").write_text("# here\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](there.md) [anchor](there.md#here) [web](https://example.com) [self](#top)\n"
                   "[gone](not-there.md) ![picture](screenshots/gone.png) [outside](../../etc/passwd)\n"
                   "```\n[in a code block](ignored.md)\n```\n")
    assert broken_links(doc, root=tmp_path) == ["not-there.md", "screenshots/gone.png", "../../etc/passwd"]


def test_a_moved_code_path_is_found(tmp_path):
    (tmp_path / "engine" / "cpu").mkdir(parents=True)
    (tmp_path / "engine" / "cpu" / "gemv.c").write_text("")
    doc = tmp_path / "doc.md"
    doc.write_text("`engine/cpu/gemv.c`, `engine/models/gemv.c`, `tests/test_x.py::test_y`, `gemv.c`\n"
                   "```\n`engine/in_a_code_block.py`\n```\n")
    assert missing_code_paths(doc, root=tmp_path) == ["engine/models/gemv.c", "tests/test_x.py"]


def test_a_renamed_code_attribute_is_found(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("`engine/cpu/int8_matmul.run_split`, `engine/read_time/read_rate.measure_read_rate`, "
                   "`engine/gone.thing`, `engine/cpu/int8_gemv.c`, `torch.mm`\n```\n`engine/cpu/int8_matmul.x`\n```\n")
    assert missing_code_attributes(doc) == ["engine/cpu/int8_matmul.run_split", "engine/gone.thing"]


def test_a_missing_named_path_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "real.md").write_text("")
    doc = tmp_path / "README.md"
    doc.write_text("`docs/real.md`, `docs/gone.md`, `Qwen/Qwen3.6-27B`, `~/.cache/x`, `--weights`\n")
    assert missing_named_paths(doc, root=tmp_path) == ["docs/gone.md"]
