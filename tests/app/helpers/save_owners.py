"""Saved folders' owners in a child process (app.saved.store_owner): one mid-save, holding the folder's lock and a
1 MiB ``.tmp-*`` folder, and the two things a start must do with what a save leaves, as checks run on a folder (by
tests/app/test_store_owner.py with ``fcntl.flock``, by test_ntfs_names.py without it, as on Windows)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from app import render
from app.saved.store_owner import leftover_bytes, sweep

ROOT = Path(__file__).resolve().parents[3]
OWNER = """
import sys, time
from pathlib import Path
from app.saved.store_owner import claim
root = Path(sys.argv[1])
claim(root)
scratch = root / ".tmp-0123abcd-x"
scratch.mkdir()
(scratch / "layer-0.kv").write_bytes(b"k" * (1 << 20))
print("saving", flush=True)
time.sleep(600)
"""


def _owner(root: Path) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", OWNER, str(root)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "saving"
    return process


def killed_save_is_counted_then_removed(tmp_path: Path) -> None:
    """A save killed mid-way leaves its folder counted while its owner lives, removed at the next start."""
    process = _owner(tmp_path)
    assert leftover_bytes(tmp_path) == 1 << 20
    assert sweep(tmp_path) == 0 and (tmp_path / ".tmp-0123abcd-x").exists()  # its owner is alive: kept
    os.kill(process.pid, signal.SIGKILL)  # kill -9 in the middle of the save
    process.wait()
    assert leftover_bytes(tmp_path) == 1 << 20  # counted meanwhile
    panel = render.saved_panel([], None, leftover=leftover_bytes(tmp_path))
    assert "1.00 MiB of an interrupted save" in panel
    assert sweep(tmp_path) == 1 << 20  # the next start: no live owner
    assert not (tmp_path / ".tmp-0123abcd-x").exists() and not list(tmp_path.glob(".owner-*"))
    assert leftover_bytes(tmp_path) == 0


def live_owners_newer_save_is_left_alone(tmp_path: Path) -> None:
    """A sweep removes only the leftovers older than every live owner, never a live owner's save."""
    process = _owner(tmp_path)
    try:
        old = tmp_path / ".tmp-feedface-old"
        old.mkdir()
        (old / "part").write_bytes(b"x" * 1000)
        os.utime(old, (time.time() - 600, time.time() - 600))  # from before the live owner started
        assert sweep(tmp_path) == 1000  # only the folder older than every live owner
        assert not old.exists() and (tmp_path / ".tmp-0123abcd-x").exists()
    finally:
        process.kill()
        process.wait()
