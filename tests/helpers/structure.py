"""The code's shape, read from its imports (an AST walk; nothing is imported): modules, import floors and loops of a
tree, the public names, the exception classes and their roots, function-local imports, and the functions over 80
lines, and the modules whose file and main class are named apart.

    python tests/helpers/structure.py [--root .] [--tree engine]

``tests/test_structure.py`` holds the rules (no loops, the KV core at the bottom, the app on public names only);
this prints the numbers docs/restructure.md gives before and after the restructure.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(root: Path, path: Path) -> list[tuple[str, list[str], bool]]:
    """(absolute module, names, at module level?) of every import in ``path``; a module-level ``if``/``try`` counts
    as module level."""
    tree = ast.parse(path.read_text())
    name = module_name(root, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = {id(node) for node in tree.body}
    for node in tree.body:
        if isinstance(node, (ast.If, ast.Try)):
            top |= {id(inner) for inner in ast.walk(node)}
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


def graph(root: Path, folder: str) -> dict[str, set[str]]:
    """Module -> the modules of the same tree it imports. Importing ``a.b.c`` runs ``a`` and ``a.b`` too, but a module
    runs inside its own packages' import (they are in ``sys.modules`` already): no edge up to them."""
    modules = {module_name(root, p): p for p in (root / folder).rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for module, names, _ in imports(root, path):
            for candidate in [f"{module}.{n}" for n in names] + [module]:
                if candidate in modules:
                    targets.add(candidate)
                    break
            parts = module.split(".")
            targets |= {".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in modules}
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


def floors(edges: dict[str, set[str]]) -> int:
    """Import floors: the longest chain of imports (loops folded into one module each)."""
    return max(levels(edges).values(), default=0)


def depth(edges: dict[str, set[str]], package: str) -> int:
    """The floor of ``package``: the highest floor of its modules (1 = imports nothing of the tree)."""
    found = levels(edges)
    return max(level for module, level in found.items() if module == package or module.startswith(package + "."))


def levels(edges: dict[str, set[str]]) -> dict[str, int]:
    """Each module's floor: 1 + the highest floor of what it imports (loops folded into one module each)."""
    comp = {m: m for m in edges}
    for component in loops(edges):
        for m in component:
            comp[m] = component[0]
    folded: dict[str, set[str]] = {}
    for m, targets in edges.items():
        folded.setdefault(comp[m], set()).update(comp[t] for t in targets if comp[t] != comp[m])
    depth: dict[str, int] = {}

    def level(m: str) -> int:
        if m not in depth:
            depth[m] = 0
            depth[m] = 1 + max((level(t) for t in folded.get(m, ())), default=0)
        return depth[m]

    return {m: level(comp[m]) for m in edges}


def exceptions(root: Path, folder: str) -> dict[str, list[str]]:
    """Exception class -> its bases, for every class of the tree whose name ends like an error."""
    found = {}
    for path in (root / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.bases and any(
                    (getattr(b, "id", None) or getattr(b, "attr", "")).endswith(("Error", "Exception", "Cancelled",
                                                                                   "Interrupted", "TooLong", "Full",
                                                                                   "Mismatch", "File", "Refused"))
                    for b in node.bases):
                found[f"{module_name(root, path)}.{node.name}"] = [ast.unparse(b) for b in node.bases]
    return found


def exported(root: Path, package: str) -> list[str]:
    tree = ast.parse((root / package / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def local_imports(root: Path, folder: str) -> int:
    files = [root / folder] if folder.endswith(".py") else list((root / folder).rglob("*.py"))
    return sum(not top for path in files for _, _, top in imports(root, path))


OWN_CODE = ("engine", "app", "benchmarks", "launch.py")  # the repo's own code, as the long-function count reads it


def long_functions(root: Path, places=OWN_CODE, limit: int = 80) -> list[tuple[str, int]]:
    """``("path:Class.function", lines)`` of every function (or method, or nested function) longer than ``limit``
    lines, counted from its ``def`` to its last line (docstring and comments included), longest first."""
    found = []

    def visit(node, path: Path, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                lines = child.end_lineno - child.lineno + 1
                if not isinstance(child, ast.ClassDef) and lines > limit:
                    found.append((f"{path.relative_to(root)}:{name}", lines))
                visit(child, path, name + ".")
            else:
                visit(child, path, prefix)

    for place in places:
        for path in [root / place] if place.endswith(".py") else sorted((root / place).rglob("*.py")):
            visit(ast.parse(path.read_text()), path, "")
    return sorted(found, key=lambda item: -item[1])


def bare_value_errors(root: Path, folder: str) -> int:
    """``raise ValueError(...)`` in the tree: user-facing refusals raise ``InputError``; a bare one is a bug's."""
    return sum(isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and
               getattr(node.exc.func, "id", None) == "ValueError"
               for path in (root / folder).rglob("*.py") for node in ast.walk(ast.parse(path.read_text())))


def homes(root: Path, tree: str = "engine") -> dict[str, set[str]]:
    """Public name (of the tree's top ``__all__`` and its public modules) -> the modules of the tree that the code of
    the repository (the tree, the app, launch.py, tests and benchmarks) imports it from."""
    public = set(exported(root, tree))
    for module in ("types", "models", "errors", "selfcheck"):
        path = root / tree / module / "__init__.py" if (root / tree / module).is_dir() else root / tree / f"{module}.py"
        if path.exists():
            tree_ = ast.parse(path.read_text())
            public |= {alias.asname or alias.name for node in tree_.body if isinstance(node, ast.ImportFrom)
                       for alias in node.names}
            public |= {node.name for node in tree_.body if isinstance(node, ast.ClassDef)}
    found: dict[str, set[str]] = {}
    files = [p for folder in (tree, "app", "tests", "benchmarks") for p in (root / folder).rglob("*.py")]
    for path in files + [root / "launch.py"]:
        for module, names, _ in imports(root, path):
            if module == tree or module.startswith(tree + "."):
                for name in names:
                    if name in public:
                        found.setdefault(name, set()).add(module)
    return found


def report(root: Path, tree: str = "engine") -> dict:
    edges = graph(root, tree)
    errors = exceptions(root, tree)
    by_class = {name.rpartition(".")[2]: bases for name, bases in errors.items()}

    def under_root(cls: str, seen=()) -> bool:
        return cls == "HeadInferError" or any(under_root(b.rpartition(".")[2], (*seen, cls))
                                                for b in by_class.get(cls, ()) if b not in seen)

    rooted = [name for name in errors if under_root(name.rpartition(".")[2])]
    several = {name: sorted(modules) for name, modules in sorted(homes(root, tree).items()) if len(modules) > 1}
    packages = {f"floor of {tree}.{p}": depth(edges, f"{tree}.{p}") for p in ("models", "session", "kv")
                if any(m == f"{tree}.{p}" or m.startswith(f"{tree}.{p}.") for m in edges)}
    return {"modules": len(edges), "floors": floors(edges), **packages, "loops": loops(edges),
            "bare ValueErrors": bare_value_errors(root, tree),
            "public names imported from more than one module": several,
            "exported": len(exported(root, tree)), "exceptions": len(errors),
            "exception files": len({name.rpartition(".")[0] for name in errors}),
            "under HeadInferError": len(rooted),
            "function-local imports": {f: local_imports(root, f) for f in (tree, "launch.py", "benchmarks")},
            "functions over 80 lines": long_functions(root)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=".")
    p.add_argument("--tree", default="engine")
    args = p.parse_args(argv)
    for key, value in report(Path(args.root).resolve(), args.tree).items():
        print(f"{key}: {value}")  # noqa: T201 (a script's output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def _words(name: str) -> set[str]:
    """``PageRanges`` and ``page_ranges`` -> {page, range}: an identifier's words, lower case, plural or not."""
    return {w.lower().removesuffix("s") for w in re.findall(r"[A-Z]+(?=[A-Z][a-z]|\d|_|$)|[A-Z]?[a-z]+|\d+", name)}


def misnamed(root: Path, places: tuple[str, ...] = ("app", "engine")) -> dict[str, str]:
    """``path: main class`` for each module that is mostly one class (the longest public one spans at least half its
    top-level code) whose file name is none of its public classes' names: a name's words within the other's
    (``questions.py`` / ``Questions``, ``policy.py`` / ``OffloadPolicy``) or its initials (``csp.py``)."""
    found = {}
    for path in sorted(p for place in places for p in (root / place).rglob("*.py") if p.name != "__init__.py"):
        body = ast.parse(path.read_text()).body
        classes = [n for n in body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")]
        code = sum(n.end_lineno - n.lineno + 1 for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef)))
        if not classes:
            continue
        main = max(classes, key=lambda n: n.end_lineno - n.lineno)
        stem = _words(path.stem.replace("_", " ").title().replace(" ", ""))
        if 2 * (main.end_lineno - main.lineno + 1) < code or any(
                stem <= _words(c.name) or _words(c.name) <= stem or path.stem == "".join(re.findall("[A-Z]", c.name)).lower()
                for c in classes):
            continue
        found[path.relative_to(root).as_posix()] = main.name
    return found
