"""A restored chat is the chat that was (issue 51): after a restart (a new ``Handlers`` over the same shelf, a new tab
state, the tab's memory as the browser kept it), each earlier answer comes back with its stats line, its support
warning and its sources as they were shown, and the first question after it says it re-reads the conversation, with
progress. Real SmolLM2, a real PDF, a store in tmp_path."""

from __future__ import annotations

import json
import re

import pytest

from app import turn_notes
from app.browser_state import BrowserState
from app.handlers import Handlers
from engine import DocumentSession, OffloadPolicy, SnapshotStore
from engine.types import Source, Support

QUESTIONS = ("What is the secret launch code of the lighthouse?", "Who keeps the lighthouse?")


def _text(html) -> str:
    return re.sub(r"<[^>]+>", "", str(html))


@pytest.mark.slow
def test_a_restart_restores_each_answer_as_shown_and_the_next_question_rereads_the_chat(embedded_model, tmp_path,
                                                                                          secret_pdf):
    model, tokenizer = embedded_model
    store = tmp_path / "kv"

    def start() -> Handlers:  # a start of the app: its own handlers, its own sessions, the shelf on disk
        return Handlers(lambda: DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=16)), SnapshotStore(store))

    before, tab = start(), BrowserState()
    before.choose_files([secret_pdf], tab)
    list(before.read(False, tab))
    chat: list = []
    for question, tokens in zip(QUESTIONS, (24, 4), strict=True):  # the second is cut at its limit
        chat = list(before.ask(question, chat, tokens, 0.0, tab))[-1].chat
    shown = [message["content"] for message in chat]
    assert "answer-stats" in shown[1] and "tok/s" in shown[1] and "Sources:" in shown[1]
    assert "cut at 4 tokens" in shown[3]
    memory = before.tab_memory(tab)
    before.clear(tab)

    after, fresh = start(), BrowserState()
    views = list(after.resume(memory, fresh))
    assert "Reopened" in _text(views[-1].status) and "2 earlier questions" in _text(views[-1].status)
    assert [message["content"] for message in views[-1].chat] == shown  # stats, warning, sources: as they were
    assert views[-1].read_button["interactive"] is False  # reopened whole: nothing new to read

    asked = list(after.ask("Where does the lighthouse stand?", views[-1].chat, 8, 0.0, fresh))
    lines = [_text(view.status) for view in asked]
    first = next(line for line in lines if "Re-reading the conversation" in line)
    total = int(re.search(r"\(([\d,]+) tokens: 2 earlier turns", first).group(1).replace(",", ""))
    assert total > fresh.session.count_tokens(QUESTIONS[0])  # the turns, not the question alone
    assert any(re.search(r"Re-reading the conversation: [\d,]+ of [\d,]+ tokens", line) for line in lines)
    assert "tok/s" in lines[-1] and not fresh.turns_unread
    later = list(after.ask("And who keeps it?", asked[-1].chat, 4, 0.0, fresh))  # now the cache holds the turns
    assert not any("Re-reading" in _text(view.status) for view in later)
    assert len(json.loads(after.tab_memory(fresh))["notes"]) == len(fresh.session.conversation())


def test_a_note_keeps_the_warning_and_sources_and_comes_back_escaped():
    flagged = Support(0.1, -2.0, False, unknown_words=("zeppelin",))
    note = turn_notes.note_of("TTFT 0.40 s · 12 tokens · 9.0 tok/s", (Source("3", 0.41), Source(None, 0.1)), flagged)
    shown = turn_notes.message("AMBER-7", json.loads(json.dumps(note)))  # through the browser's JSON and back
    assert "⚠" in shown and "zeppelin" in shown and "p. 3 (41%)" in shown and "document (10%)" in shown
    assert "9.0 tok/s" in shown
    assert "⚠" not in turn_notes.message("AMBER-7", turn_notes.note_of("stats", (), None))

    hostile = [{"stats": "<img src=x onerror=alert(1)>", "sources": [["<script>", 0.5], ["x", "big"], 3],
                "unsupported": ["<b>bold</b>", 7]}, "junk", {"sources": []}]
    notes = turn_notes.read_back(hostile)
    assert notes[1:] == [None, None]
    page = turn_notes.message("answer", notes[0])
    assert "<img" not in page and "<script>" not in page and "<b>" not in page
    assert "&lt;img" in page and "&lt;script&gt;" in page
    assert turn_notes.read_back("not a list") == [] and turn_notes.aligned([1, 2, 3], 2) == [2, 3]
    assert turn_notes.aligned([1], 3) == [None, None, 1] and turn_notes.aligned([1], 0) == []
