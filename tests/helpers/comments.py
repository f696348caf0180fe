"""Comments and docstrings over three lines that carry measurements (a figure with a unit: ms, s, GiB, tok/s, %, ×):
numbers live in the reports under docs/benchmarks/, a comment says why in a line or two and names its report.

    python tests/helpers/comments.py [PATH ...]    # lists them (default: engine, app, launch.py, process_env.py)
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from dataclasses import replace as dataclasses_replace
from pathlib import Path

MAX_LINES = 3
PLACES = ("engine", "app", "launch.py", "process_env.py")
_NUMBER = r"(?<![\w.])\d[\d,_]*(?:\.\d+)?"
_UNITS = r"(?:ms|µs|us|ns|s|min|h|GB|GiB|MB|MiB|KB|KiB|kB|TB|TiB|B/s|GB/s|GiB/s|tok/s|tokens/s|[GT]FLOP/s|W)"
FIGURE = re.compile(rf"{_NUMBER}\s?{_UNITS}\b|{_NUMBER}\s?(?:%|×)|{_NUMBER}x\b")


@dataclass(frozen=True)
class Block:
    path: Path
    kind: str  # "comment" (a run of whole-line comments) or "docstring"
    first: int
    last: int
    figures: int  # its lines that carry a figure

    def __str__(self) -> str:
        return f"{self.path}:{self.first}-{self.last} ({self.kind}, {self.last - self.first + 1} lines, " \
               f"{self.figures} with figures)"


def _runs(lines: list[str]):
    run: list[int] = []
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("#") and not line.startswith("#!"):
            run.append(number)
            continue
        if run:
            yield "comment", run[0], run[-1]
        run = []
    if run:
        yield "comment", run[0], run[-1]


def _docstrings(text: str):
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                yield "docstring", first.lineno, first.end_lineno


def long_blocks_with_figures(path: Path) -> list[Block]:
    """The comment runs and docstrings of ``path`` over ``MAX_LINES`` lines with a figure in them."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    found = []
    for kind, first, last in [*_runs(lines), *_docstrings(text)]:
        figures = sum(bool(FIGURE.search(line)) for line in lines[first - 1 : last])
        if last - first + 1 > MAX_LINES and figures:
            found.append(Block(path, kind, first, last, figures))
    return sorted(found, key=lambda block: block.first)


def python_files(root: Path, places=PLACES) -> list[Path]:
    files = []
    for place in places:
        path = root / place
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.exists() else []
    return files


def main(argv: list[str]) -> None:
    root = Path.cwd()
    blocks = [block for path in python_files(root, argv or PLACES) for block in long_blocks_with_figures(path)]
    for block in blocks:
        print(dataclasses_replace(block, path=block.path.relative_to(root)) if block.path.is_absolute() else block)
    print(f"{len(blocks)} blocks, {sum(block.figures for block in blocks)} lines with figures")


if __name__ == "__main__":
    main(sys.argv[1:])
