"""The docs' one link checker (tests/test_docs.py for the README and docs/*.md, tests/test_docs_index.py for
docs/benchmarks): the relative links, named files and code paths of a Markdown doc that are no file or folder inside
the repo."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\]\(([^()\s]+)\)")  # [text](target) and ![alt](target)
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # https:, mailto:, ...
# a code file named in backticks by its repo path (`engine/cpu/gguf_gemv.c`, `tests/engine/kv/test_x.py::test_y`):
# moved code leaves its old path in the docs
CODE_PATH = re.compile(r"`((?:app|benchmarks|engine|scripts|tests)/[\w./-]*\.(?:py|c|h|sh))(?:::\w+)?`")


def prose(text: str) -> str:
    """``text`` without its fenced code blocks (their contents are commands and code, not references)."""
    return FENCE.sub("", text)


def unresolved(doc: Path, targets: Iterable[str], root: Path, *, from_root: bool = False) -> list[str]:
    """The ``targets`` (anchors stripped; web addresses and in-page anchors skipped) that are no file or folder
    inside ``root``, read from ``doc``'s folder, and with ``from_root`` from ``root`` as well (``benchmarks/x.py``)."""
    missing = []
    for target in targets:
        if _SCHEME.match(target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        bases = (doc.parent, root) if from_root else (doc.parent,)
        found = [(base / path).resolve() for base in bases if (base / path).exists()]
        if not any(p.is_relative_to(root.resolve()) for p in found):
            missing.append(target)
    return missing


def broken_links(doc: Path, root: Path) -> list[str]:
    """The relative link targets in ``doc``'s prose that are not a file or folder inside ``root``."""
    return unresolved(doc, LINK.findall(prose(doc.read_text(encoding="utf-8"))), root)


def missing_code_paths(doc: Path, root: Path) -> list[str]:
    """The repo code paths ``doc``'s prose names in backticks that are no file inside ``root`` (read from the root)."""
    return unresolved(doc, CODE_PATH.findall(prose(doc.read_text(encoding="utf-8"))), root, from_root=True)
