"""The KV and Context meters during a real read fill as it goes, against what the plan reserved (issue 51: they sat at
the reserved size and at 0 until the end)."""

from __future__ import annotations

import re

import pytest

from app.browser_state import BrowserState
from app.handlers import Handlers
from app.meters import meters_html
from engine import DocumentSession, OffloadPolicy, read_memory

pytestmark = pytest.mark.slow


def _number(html: str, name: str) -> int:
    return int(re.search(rf'data-{name}="(\d+)"', html).group(1))


def _kv_fill(html: str) -> float:
    return float(re.search(r'meter-kv">.*?meter-fill" style="width:([\d.]+)%', html, re.S).group(1))


def test_meters_during_a_read_show_written_against_reserved(embedded_model, secret_pdf):
    model, tokenizer = embedded_model
    handlers = Handlers(lambda: DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=16)))  # several reports
    state = BrowserState()
    handlers.choose_files([secret_pdf], state)
    midway = []
    for view in handlers.read(False, state):
        done, total = (re.search(rf'data-{name}="(\d+)"', str(view.progress)) for name in ("done", "total"))
        if 'data-state="running"' in str(view.progress) and 0 < int(done.group(1)) < int(total.group(1)):
            midway.append((int(done.group(1)), int(total.group(1)), handlers.meters(state)))
    assert midway, "the read reported no progress midway"
    done, total, html = midway[len(midway) // 2]
    reserved = _number(html, "kv-device") + _number(html, "kv-host")
    # The tokens read so far, not 0 (the read goes on in its thread: by the meters' look it may be a chunk further).
    assert done <= _number(html, "context-tokens") <= total
    assert 0 < _number(html, "kv-written") < reserved  # written so far, not the reserved size
    assert 0 < _kv_fill(html) < 100
    assert "written / reserved" in html
    # Filled in proportion: the written bytes go as the tokens done (the plan's bytes per token).
    fills = [_number(page, "kv-written") / _number(page, "context-tokens") for _, _, page in midway]
    assert max(fills) == pytest.approx(min(fills), rel=1e-6)
    after = handlers.meters(state)  # the read over: the cache's own count
    assert _number(after, "context-tokens") == state.session.document_tokens
    assert _number(after, "kv-written") > _number(html, "kv-written")


def test_meters_before_a_document_write_nothing():
    html = meters_html(read_memory(), None)
    assert 'data-kv-written="0"' in html and "no document" in html
