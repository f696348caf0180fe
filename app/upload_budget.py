"""How many upload bytes ``app.guard`` lets in when others can reach the app: Gradio's upload route takes files
without a session (only ``--max-upload`` per file applies), so without a budget one visitor can fill the disk.

A visitor (their login, a cookie Gradio issued, else their address; under ``--share`` every visitor arrives from
loopback, so without logins they share one) may send ``per_client`` bytes in any ``window``; and the upload folder may
hold ``total`` bytes (measured, with the uploads in flight). An upload must say its length (``Content-Length``): it is counted before a byte
is read.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from app.disk_usage import folder_bytes
from byte_units import format_bytes

UPLOAD_PATH = re.compile(r"^(?:/gradio_api)?/upload/?$")
GiB = 1 << 30


@dataclass(frozen=True)
class UploadLimits:
    """``per_client`` bytes in ``window`` seconds per visitor; ``total`` bytes held in the upload folder."""

    per_client: int = GiB
    window: float = 3600.0
    total: int = 8 * GiB


def upload_folder() -> Path | None:
    """Where Gradio keeps uploads (``GRADIO_TEMP_DIR``, which ``app.ui.build_ui`` sets), or None."""
    folder = os.environ.get("GRADIO_TEMP_DIR")
    return Path(folder) if folder else None


class UploadBudget:
    """Counts each visitor's upload bytes over a sliding window; ``take`` says why an upload is refused."""

    def __init__(self, limits: UploadLimits = UploadLimits(), folder=upload_folder, clock=time.monotonic) -> None:
        self.limits = limits
        self.folder = folder
        self.clock = clock
        self.sent: deque[tuple[float, str, int]] = deque()  # (when, visitor, bytes), oldest first
        self.lock = threading.Lock()

    def take(self, visitor: str, size: int | None) -> tuple[int, str] | None:
        """Counts an upload of ``size`` bytes from ``visitor``: ``(status, reason)`` when refused, else None."""
        if size is None:
            return 411, "An upload must say its length (Content-Length)."
        held = folder_bytes(self.folder())  # outside the lock: a walk of the folder
        with self.lock:
            now = self.clock()
            while self.sent and self.sent[0][0] <= now - self.limits.window:
                self.sent.popleft()
            mine = sum(count for _, who, count in self.sent if who == visitor)
            if mine + size > self.limits.per_client:
                return 429, (f"Upload refused: at most {format_bytes(self.limits.per_client)} per visitor in "
                             f"{self.limits.window / 60:.0f} minutes; try again later.")
            if held + size > self.limits.total:
                return 413, (f"Upload refused: the app's upload folder is full ({format_bytes(self.limits.total)}); "
                             f"try again later.")
            self.sent.append((now, visitor, size))
        return None


def visitor_of(scope, headers: dict[str, str]) -> str:
    """Who sent a request: their login (a Gradio ``access-token-*`` cookie the app issued) when logged in, else their
    address. A cookie Gradio does not know is no login: one made up per upload was a fresh budget each."""
    logins = getattr(scope.get("app"), "tokens", None) or {}  # Gradio's app: its issued tokens -> user names
    for part in headers.get("cookie", "").split(";"):
        name, _, value = part.strip().partition("=")
        if name.startswith("access-token") and value in logins:
            return f"login:{logins[value]}"
    client = scope.get("client")
    return f"address:{client[0] if client else ''}"
