"""The model picker's table in a real Chromium: how long its steps may take, its rows, and a wait on an element's text
that says what the element showed when it times out."""

from __future__ import annotations

import os

import pytest

# A busy 2-core machine: measuring a model's FLOP rate alone (the picker's first open) can take 30 s there.
PICKER_TIMEOUT_MS = int(os.environ.get("PICKER_TIMEOUT_MS", 240_000))
# Every row of the (virtualised) table: scrolls it through, collecting cells by the row
# they are shown in (a sorted view keeps each cell's data-row) and their column.
ROWS_JS = """async () => {
  const view = document.querySelector('#picker-table .virtual-table-viewport');
  const rows = {};
  for (let top = 0; ; top += 150) {
    view.scrollTop = top;
    await new Promise(resolve => setTimeout(resolve, 60));
    for (const cell of document.querySelectorAll('#picker-table [role=gridcell]')) {
      (rows[cell.closest('[role=row]').dataset.index] ??= [])[Number(cell.dataset.col)] = cell.innerText.trim();
    }
    if (top > view.scrollHeight) break;
  }
  view.scrollTop = 0;
  return Object.keys(rows).sort((a, b) => a - b).map(key => rows[key]);
}"""


def wait_text(page, selector: str, *texts: str) -> None:
    """Waits until ``selector``'s text holds every one of ``texts``; on a timeout fails saying what it held."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    checks = " && ".join(f"t.includes({text!r})" for text in texts)
    try:
        page.wait_for_function(f"() => {{ const t = document.querySelector({selector!r})?.innerText || ''; "
                               f"return {checks}; }}")
    except PlaywrightTimeout:
        shown = page.evaluate(f"() => document.querySelector({selector!r})?.innerText")
        pytest.fail(f"{selector} never said {texts}; it says {shown!r}")
