"""What one screen says of sizes and counts, in a real Chromium (issue 51: "token counts disagree on one screen
(4,984 / 5,056) and sizes mix MiB and MB"). A real PDF too large for SmolLM2's window: its plan says the context it
needs, not that it is reserved; the first part that fits is read, and the files table, the plan, the progress, the
status line and the Context meter count it once, as the plan does; the meters, the plan, the first-pick card and
the picker's table say every size in binary units (the card's rate in MiB/s)."""

from __future__ import annotations

import re

import huggingface_hub.constants
import pytest
from chromium import chromium_page
from first_pick_hub import FILES, on_the_4090, pick_id
from hub_server import HubServer
from make_files import make_pdf
from picker_page import PICKER_TIMEOUT_MS, ROWS_JS, wait_text
from studio import served

from app.first_pick import FirstPick
from app.picker import COLUMNS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DECIMAL = re.compile(r"\d[ \u00a0]?[KMGT]B\b")  # "1.1 GB", "50 MB/s": the decimal units the page no longer says
FILLER = "The keeper walked along the harbour wall, counted the boats and wrote the weather in her logbook. " * 9


def _number(page, selector: str, name: str) -> int:
    return int(page.get_attribute(selector, f"data-{name}"))


def _page_text(page) -> str:
    """What the page says, less the size Gradio's own upload widget gives a dropped file ("54.6 KB", its words)."""
    return page.evaluate("""() => { const body = document.body.cloneNode(true);
      body.querySelectorAll('#file-drop td.download').forEach(cell => cell.remove());
      return body.innerText; }""")


def test_one_screen_counts_the_read_once_and_says_sizes_in_one_unit_family(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADINFER_CACHE", str(tmp_path / "studio"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    pdf = make_pdf(tmp_path / "harbour-log.pdf", [f"Log page {n}. {FILLER}" for n in range(50)])
    picker = on_the_4090()
    with HubServer(pick_id(), FILES) as hub, served(chunk_size=256, picker=picker.build,
                                                    first_pick=FirstPick(picker).build) as url:
        picker.endpoint = hub.endpoint
        with chromium_page(url, height=1000, timeout_ms=PICKER_TIMEOUT_MS) as page:
            page.locator("#first-pick").wait_for(state="visible")
            page.locator("#file-drop input[type=file]").set_input_files(str(pdf))
            page.wait_for_selector("#plan .plan[data-fits=false]")
            plan = page.inner_text("#plan")
            limit, context = _number(page, "#plan .plan", "limit"), _number(page, "#plan .plan", "context-tokens")
            assert context > limit == 8192 and "Context reserved" not in plan, plan
            assert f"{context:,} tokens · more than the {limit:,}-token limit: none reserved" in plan
            whole = _number(page, "#plan .plan", "tokens")
            assert _number(page, "#files-table .files-scroll", "read-tokens") == whole

            page.click("#first-part")
            page.wait_for_selector("#range-info .range-info[data-fits=true]")
            page.wait_for_selector("#plan .plan[data-fits=true]")
            page.click("#read")
            page.wait_for_selector("#prefill-progress .progress[data-state=done]")
            read = _number(page, "#plan .plan", "tokens")
            reserved = _number(page, "#plan .plan", "context-tokens")
            assert read < whole and _number(page, "#files-table .files-scroll", "read-tokens") == read
            assert _number(page, "#prefill-progress .progress", "total") == read
            assert f"{read:,} tokens" in page.inner_text("#status")
            assert f"Context reserved\n{reserved:,} tokens" in page.inner_text("#plan")
            # The meters tick each second: the Context meter counts the read as the plan does, against its reserve.
            wait_text(page, "#meters", "filled / reserved", f"{read:,} / {reserved:,} tokens")

            page.click("#picker .label-wrap")
            wait_text(page, "#picker-table", pick_id())
            rows = [row for row in page.evaluate(ROWS_JS) if row and row[0]]
            download = COLUMNS.index("Download (GiB)")
            assert rows and all(re.fullmatch(r"\d+(\.\d+)?", row[download]) for row in rows), rows[:2]
            assert not [cell for row in rows for cell in row if cell and DECIMAL.search(cell)]
            card, text = page.inner_text("#first-pick"), _page_text(page)
            assert "GiB" in card and "MiB/s" in card, card
            assert "MiB" in page.inner_text("#meters") and not DECIMAL.findall(text), DECIMAL.findall(text)
