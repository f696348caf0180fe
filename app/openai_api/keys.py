"""The API's key: read from a file (``--api-key FILE``) or ``HEADINFER_API_KEY``, never from the command line (a key
there shows in ``ps`` to every user of the machine, as ``--auth``'s password did: ``app.auth``). A request then needs
``Authorization: Bearer <key>``, compared in constant time."""

from __future__ import annotations

import hmac
import os
from pathlib import Path

ENV_VAR = "HEADINFER_API_KEY"
MIN_LENGTH = 16  # a guessable key is no key: at least this many characters


class ApiKeyError(ValueError):
    """A key file or variable that cannot be used, and why."""


def read_key(path: str | None, environ: dict[str, str] | None = None) -> str | None:
    """The key from ``path`` (its first line) or, without one, ``HEADINFER_API_KEY``; None when neither is set."""
    if path is not None:
        file = Path(path).expanduser()
        if not file.is_file():
            raise ApiKeyError(f"--api-key takes a file holding the key, and {path!r} is no file (a key written on the "
                              f"command line shows in `ps`; put it in a file, or in {ENV_VAR})")
        lines = file.read_text(encoding="utf-8").splitlines()
        key, where = (lines[0].strip() if lines else ""), str(file)
    else:
        key, where = (os.environ if environ is None else environ).get(ENV_VAR, "").strip(), ENV_VAR
        if not key:
            return None
    if len(key) < MIN_LENGTH or any(ch.isspace() for ch in key):
        raise ApiKeyError(f"the API key in {where} must be at least {MIN_LENGTH} characters with no spaces "
                          "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
    return key


def allows(key: str | None, authorization: str | None) -> bool:
    """Whether an ``Authorization`` header opens the API (always, when it has no key)."""
    if key is None:
        return True
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key.encode())
