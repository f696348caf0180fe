"""``pip install .`` (pyproject.toml): the wheel the real build backend makes holds what ``launch.py`` runs, its
``headinfer-studio`` entry point runs ``launch:main``, and its dependencies are requirements.txt's."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "requirements.txt", "README.md", "launch.py", "process_env.py", "byte_units.py", "app",
           "engine", "assets")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    # The build backend (requirements-dev.txt), built here without a download; 70.1 builds wheels without `wheel`.
    pytest.importorskip("setuptools", minversion="70.1")
    tree, out = tmp_path_factory.mktemp("tree"), tmp_path_factory.mktemp("wheel")
    for name in SOURCES:  # a copy: the build writes build/ and *.egg-info beside its sources
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyi"))
        else:
            shutil.copy(source, tree / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(tree),
                    "-w", str(out)], check=True, capture_output=True, timeout=600)
    [built] = out.glob("headinfer_studio-*.whl")
    return zipfile.ZipFile(built)


def _top_level_imports(path: Path) -> set[str]:
    return {(node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
            for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, (ast.Import, ast.ImportFrom))
            and not getattr(node, "level", 0) for alias in node.names}


def test_the_wheel_holds_what_launch_runs(wheel):
    names = set(wheel.namelist())
    ours = {p.stem for p in ROOT.glob("*.py")} | {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    for module in _top_level_imports(ROOT / "launch.py") | _top_level_imports(ROOT / "process_env.py"):
        if module in ours:
            assert f"{module}.py" in names or f"{module}/__init__.py" in names, module
    wanted = {"launch.py", "process_env.py", "byte_units.py", "app/cli.py", "app/startup.py", "app/upload_check.js",
              "engine/kv/host_kernel.c", "engine/native/common.h", "engine/models/catalogue.json",
              "assets/style.css", "assets/logo.svg"}  # the C kernels built at first use, the page's assets (app/ui.py)
    assert wanted <= names, wanted - names
    assert {name for name in names if name.endswith(".py")} >= {
        str(p.relative_to(ROOT)) for folder in ("app", "engine") for p in (ROOT / folder).rglob("*.py")}
    assert not [name for name in names if name.startswith(("tests/", "benchmarks/", "docs/"))]


def test_the_entry_point_runs_launch_main_and_the_dependencies_are_requirements_txt(wheel):
    from packaging.requirements import Requirement

    [entry_points] = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    assert "headinfer-studio = launch:main" in wheel.read(entry_points).decode()
    [metadata] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    lines = wheel.read(metadata).decode().splitlines()
    required = {str(Requirement(line.split(": ", 1)[1])) for line in lines if line.startswith("Requires-Dist: ")}
    listed = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    assert required == {str(Requirement(entry)) for entry in listed if entry}
    assert "Requires-Python: >=3.11" in lines
