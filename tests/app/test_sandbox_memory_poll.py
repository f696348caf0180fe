"""Where the reader child cannot cap its own memory (Windows: no ``RLIMIT_AS``; forced here, as the Windows-shaped
run forces it), the app polls the child's resident memory and kills it past the limit: a PDF bomb is refused with
the memory message, not read until the machine runs out, and the next file reads in a fresh child."""

from __future__ import annotations

import time

import pytest

from app.documents import Box, DocumentError, sandbox
from app.documents.limits import BoxLimits
from benchmarks.app.bombs import make_good_epub, make_pdf_bomb


def test_a_bomb_is_killed_by_the_memory_poll_without_resource(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "HAS_RESOURCE", False)
    limit = 400 << 20
    box = Box(BoxLimits(memory_bytes=limit, seconds=120))
    peaks = []
    resident = sandbox._Child._resident
    monkeypatch.setattr(sandbox._Child, "_resident", lambda child: peaks.append(resident(child)) or peaks[-1])
    try:
        started = time.monotonic()
        with pytest.raises(DocumentError, match=r"^bomb.pdf needed more memory than one file may take to read \("):
            box.extract(make_pdf_bomb(tmp_path / "bomb.pdf"), "bomb.pdf")
        assert time.monotonic() - started < 60
        assert max(peaks) > limit and sorted(peaks)[-2] <= limit  # polled while it grew; killed at the first look past
        assert "tide tables in a blue tin" in box.extract(make_good_epub(tmp_path / "good.epub"), "good.epub").text
    finally:
        box.close()
