"""The meters' words: the Context meter says what it counts, filled against reserved, the tokens the plan panel's
"Context reserved" counts (issue 51: a bare "Context 1,724 / 3,728 tokens" beside the plan's counts)."""

from __future__ import annotations

from app.meters import meters_html
from engine.types import MemorySnapshot

SNAPSHOT = MemorySnapshot(gpu_used=None, gpu_total=None, gpu_name=None, process_rss=1 << 30,
                          system_used=4 << 30, system_total=16 << 30, system_available=12 << 30)


def test_the_context_meter_says_filled_against_reserved():
    kv = {"kv_device": 0, "kv_host": 160 << 20, "context_tokens": 1_724, "max_context": 3_728}
    html = meters_html(SNAPSHOT, kv)
    assert "Context <small>filled / reserved</small>" in html and "1,724 / 3,728 tokens" in html
    assert 'data-context-tokens="1724"' in html and 'data-max-context="3728"' in html
    assert "<span>Context</span>" in meters_html(SNAPSHOT, None) and "no document" in meters_html(SNAPSHOT, None)
