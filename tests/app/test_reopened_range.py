"""A reopened tab shows its page range (issue 51): after a reload, the tab's saved range comes back with the range
named in the files table and the status line, the table counting the range's pages, and Read off. Real SmolLM2."""

from __future__ import annotations

import re

import pytest
from make_files import make_pdf

from app.browser_state import BrowserState
from app.handlers import Handlers
from engine import DocumentSession, OffloadPolicy, SnapshotStore

pytestmark = pytest.mark.slow


def test_a_reloaded_tab_names_the_page_range_it_holds(embedded_model, tmp_path):
    model, tokenizer = embedded_model
    policy = OffloadPolicy(chunk_size=16, max_context=288)
    handlers = Handlers(lambda: DocumentSession(model, tokenizer, policy, answer_budget=64),
                        SnapshotStore(tmp_path / "kv"))
    pdf = str(make_pdf(tmp_path / "tides.pdf", [f"Chapter {n}. " + "The tide rises and falls twice a day. " * 9
                                                for n in range(4)]))
    tab = BrowserState()
    handlers.choose_files([pdf], tab)
    handlers.range_offer(tab)
    handlers.choose_range(1, 1, tab)
    label = tab.range_label
    assert label and list(handlers.read(False, tab))[-1].progress.count('data-state="done"') == 1
    memory = handlers.tab_memory(tab)

    reloaded = BrowserState()  # the same tab after a reload: its memory handed back
    views = list(handlers.resume(memory, reloaded))
    last = views[-1]
    assert label in re.sub(r"<[^>]+>", "", last.status) and label in last.table
    assert last.table.count('class="file-name"') == 1 and reloaded.range_label == label
    assert not last.read_button["interactive"]
