"""The model's id as API clients see it: the catalogue's id (``org/name``, as the Hub spells it) or the served
folder's name, never a path on this machine (``GET /v1/models`` went to every client: ``/home/alice/models/...``
said whose machine it is and where its files live)."""

from __future__ import annotations

import re
from pathlib import Path, PureWindowsPath

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")  # org/name
_NOT_A_NAME = {"/", "\\", ".", "..", "~"}
FALLBACK = "headinfer"


def public_id(name: str | None) -> str:
    """``name`` (the served model's ``name_or_path``) as clients see it: a Hub id as it is, else the last part of
    the path (a local folder, a converted GGUF's cache folder, ``~/models/x``, ``C:\\models\\x``)."""
    text = (name or "").strip()
    if _HUB_ID.match(text) and ".." not in text and not Path(text).expanduser().exists():
        return text
    # PureWindowsPath splits on both separators, so a Windows path served elsewhere loses its folders too.
    parts = [part for part in PureWindowsPath(text).parts if part not in _NOT_A_NAME and not part.endswith((":", ":\\"))]
    return parts[-1] if parts else FALLBACK
