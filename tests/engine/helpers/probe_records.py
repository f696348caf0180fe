"""What a crash probe (``engine.native.crash_probe``) recorded, for the tests that aim a probe at a dying child."""

from __future__ import annotations

import json
import signal
from pathlib import Path


def died_of_abort(cache: Path, name: str) -> bool:
    """Whether the one probe record of ``name`` under the cache ``cache`` says its child did not survive, killed by
    SIGABRT (what ``PROBE = "os:abort"`` does, as an illegal instruction would)."""
    record = json.loads(next((cache / "kernels" / "probes").glob(f"{name}-*.json")).read_text())
    return record["survives"] is False and record["detail"].startswith(f"signal {int(signal.SIGABRT)}")
