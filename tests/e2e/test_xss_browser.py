"""No script from a document, in a real Chromium (issue 54): a 210 KB ``.txt`` whose first line is a file header
carrying a script, ``=== <img src=x onerror=alert(document.domain)> ===``, with page markers of its own, read with
"Truncate to fit". The plan panel of a truncated read names where it stopped; that name once came from the
document's own ``=== … ===`` line, unescaped, and the script ran twice. Here no dialog opens and no
``img[onerror]`` is in the page."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from chromium import chromium_page
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from studio import served

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TIMEOUT_MS = 300_000
SCRIPT = "<img src=x onerror=alert(document.domain)>"
FILLER = "The keeper walked along the harbour wall, counted the boats and wrote the weather in her logbook. "


def hostile_text(path: Path, size: int = 210_000) -> Path:
    """The reproduction: the forged header first, then pages with forged ``[page N]`` markers, ``size`` bytes."""
    parts, page = [f"=== {SCRIPT} ==="], 1
    while sum(len(part) + 1 for part in parts) < size:
        parts += [f"[page {page}]", FILLER * 20, f"=== {SCRIPT} ==="]
        page += 1
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return path


def short_window():
    """Sessions with a 1,280-token context limit and a 256-token conversation allowance: the truncated read is
    about 1,000 tokens, quick on a busy CPU (the script ran as the read started, from the plan of what is read)."""
    import dataclasses

    from engine import DocumentSession

    class ShortWindow(DocumentSession):
        def __init__(self, model, tokenizer, policy=None, **kwargs):
            super().__init__(model, tokenizer, dataclasses.replace(policy, max_context=1280), answer_budget=256,
                             **kwargs)

    return ShortWindow


def test_a_documents_own_header_runs_no_script_in_a_truncated_read(tmp_path):
    txt = hostile_text(tmp_path / "notes.txt")
    assert 200_000 <= txt.stat().st_size <= 220_000
    with served(short_window(), chunk_size=256) as url, chromium_page(url, height=1000, timeout_ms=TIMEOUT_MS) as page:
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.locator("#file-drop input[type=file]").set_input_files(str(txt))
        # Over the context limit (a refused set's panel says data-fits=false too, with no truncation offered).
        page.wait_for_selector("#plan .plan[data-fits=false]:not(.plan-refused)")
        page.locator("#truncate input[type=checkbox]").check()
        page.click("#read")
        # The plan of what is read, with where it stops, shows as the read starts: the script ran from there.
        page.wait_for_selector("#plan .plan[data-truncated-from]")
        page.wait_for_timeout(3000)  # time for an injected image to fail and its handler to run
        injected = page.locator("img[onerror], [onerror], [onload], script:not([src])").evaluate_all(
            "nodes => nodes.filter(n => n.outerHTML.includes('alert')).map(n => n.outerHTML)")
        plan = page.inner_text("#plan")
        if page.locator("#cancel").is_enabled():  # the read itself is not needed (minutes on a busy CPU)
            with contextlib.suppress(PlaywrightTimeout):  # a read that ends meanwhile disables Cancel: nothing to stop
                page.locator("#cancel").click(timeout=10_000)
    assert dialogs == [], f"a document's text ran script: {dialogs}"
    assert injected == []
    assert "Read the first" in plan
