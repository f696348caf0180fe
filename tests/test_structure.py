"""The house rules of the code, read from its imports (an AST walk, nothing is imported): no import loops in the
engine or the benchmarks, the KV core imports nothing above it, the app never imports torch, and the app and
``launch.py`` use only the engine's public names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Public modules and the names they offer: the top API, the data it exchanges, the models wing (the picker), the
# self-check, and the error classes.
PUBLIC = ("engine", "engine.types", "engine.models", "engine.selfcheck", "engine.errors")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, list[str], bool]]:
    """(absolute module, names, module level?) of every import in ``path``."""
    tree = ast.parse(path.read_text())
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            found.append((module, [a.name for a in node.names], id(node) in top))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], id(node) in top) for a in node.names]
    return found


def graph(folder: str) -> dict[str, set[str]]:
    """Module -> the modules of the same tree it imports (a submodule import also runs its packages' __init__)."""
    modules = {module_name(p): p for p in (ROOT / folder).rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for module, names, _ in imports(path):
            for candidate in [f"{module}.{n}" for n in names] + [module]:
                if candidate in modules:
                    targets.add(candidate)
                    break
            parts = module.split(".")
            targets |= {".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in modules}
        # A module runs inside its own packages' import (they are in sys.modules already): no edge up to them.
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        edges[name] = targets - {name} - ancestors
    return edges


def loops(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("folder", ["engine", "benchmarks"])
def test_no_import_loops(folder):
    # Package __init__ files import their own submodules by design; a loop through one is still a loop.
    assert loops(graph(folder)) == []


def test_the_loop_finder_finds_a_loop():
    assert loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_kv_core_imports_nothing_above_it():
    for path in (ROOT / "engine" / "kv").rglob("*.py"):
        for module, _, _ in imports(path):
            if module.startswith("engine.") and not module.startswith("engine.kv"):
                assert module in ("engine.errors", "engine.paths"), f"{path.name} imports {module}"


def test_the_app_never_imports_torch_and_uses_only_public_engine_names():
    import importlib

    offered = {name: set(getattr(module, "__all__", None) or [n for n in vars(module) if n[0].isupper()])
               for name, module in ((name, importlib.import_module(name)) for name in PUBLIC)}
    files = list((ROOT / "app").rglob("*.py")) + [ROOT / "launch.py"]
    for path in files:
        for module, names, _ in imports(path):
            assert module.split(".")[0] not in ("torch", "transformers"), f"{path.name} imports {module}"
            if module == "engine" or module.startswith("engine."):
                assert module in offered, f"{path.relative_to(ROOT)} imports the internal module {module}"
                unknown = [n for n in names if n not in offered[module] and module != "engine" or
                           (module == "engine" and n not in offered[module] and n != "selfcheck")]
                assert not unknown, f"{path.relative_to(ROOT)} imports {unknown} from {module}, not public there"


def test_the_top_api_is_about_a_dozen_names():
    import engine

    assert len(engine.__all__) <= 14
