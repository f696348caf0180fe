"""The shelf's offer for a read cut short: "Continue reading (62%)" with the tokens left and an estimate."""

from __future__ import annotations

import re
from pathlib import Path

from app import render
from engine.types import SnapshotInfo


def _info(num_read: int | None, read_seconds: float = 0.0) -> SnapshotInfo:
    return SnapshotInfo("0" * 32, "manual.pdf", 10_000, 5 << 20, 0.0, 0.0, "SmolLM2", "float32", Path("/nowhere"),
                        num_read=num_read, read_seconds=read_seconds)


def _text(html_text: str) -> str:
    return re.sub(r"<[^>]+>", "", html_text)


def test_a_partial_read_is_offered_with_what_is_left_and_its_estimate():
    partial = _info(6_200, read_seconds=310.0)  # 20 tokens/s so far: 3,800 left take about 3 minutes
    panel = _text(render.saved_panel([partial], None))
    assert "Continue reading (62%) · 3,800 tokens left · about 3 min" in panel
    assert render.saved_choice_label(partial).endswith("Continue reading (62%)")
    assert partial.remaining_seconds == 190.0


def test_a_complete_snapshot_has_no_offer_and_an_unknown_rate_no_estimate():
    assert "Continue reading" not in render.saved_panel([_info(None)], None)
    assert "Continue reading" not in render.saved_choice_label(_info(None))
    assert "about" not in _text(render.saved_panel([_info(5_000)], None))
