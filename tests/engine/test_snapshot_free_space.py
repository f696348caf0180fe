"""A save refused for want of disk space says both sizes in the meters' units (issue 51: it said "GB" beside the
page's MiB and GiB)."""

from __future__ import annotations

import errno
import re
import shutil
from types import SimpleNamespace

import pytest

from engine import SnapshotStore


def test_the_refusal_names_the_sizes_in_binary_units(tmp_path, monkeypatch):
    store = SnapshotStore(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: SimpleNamespace(free=300 << 20, total=1 << 40, used=0))
    with pytest.raises(OSError) as caught:
        store._require_free_space(3 << 30)
    message = str(caught.value)
    assert caught.value.errno == errno.ENOSPC
    assert "for a 3.00 GiB snapshot (300.00 MiB free in" in message and not re.search(r"\d ?[KMGT]B\b", message)
