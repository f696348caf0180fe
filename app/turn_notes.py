"""What the chat shows beside each answer besides its words: the stats line (TTFT, tok/s, "stopped", "cut at…"), the
"the document may not say" warning and the sources, kept per turn so that a restored chat is the chat that was.

The engine's conversation holds (question, answer) text only; the tab keeps a note per turn beside it (``BrowserState.
turn_notes``, aligned with ``DocumentSession.conversation()``), and the tab's memory across a reload (``app.saved.open_saved``)
carries both. A note read back comes from the browser, so it is taken field by field, typed, and every part of it
reaches the page through ``app.render`` and ``app.escape`` as a fresh answer's does.
"""

from __future__ import annotations

from app import render
from engine.types import Source, Support

_MAX_NOTE_TEXT = 2000  # characters of a stats line or a word read back: what the app writes is far shorter


def note_of(stats: str, sources=(), support=None) -> dict:
    """The note of an answer as it was shown: ``support`` is None when no warning was shown (a stopped or cut
    answer, or no signal)."""
    note: dict = {"stats": stats, "sources": [[source.page, float(source.share)] for source in sources]}
    if support is not None and not support.is_supported:
        note["unsupported"] = list(support.unknown_words)
    return note


def message(text: str, note: dict | None, pages: dict | None = None) -> str:
    """The assistant's chat message for ``text`` with its ``note`` (None: the words alone)."""
    if not note:
        return render.model_markdown(text) or "…"
    sources = [Source(page, share) for page, share in note.get("sources", [])]
    # The warning as it was decided then: only its outcome and the words it named are shown.
    flag = Support(None, None, False, unknown_words=tuple(note["unsupported"])) if "unsupported" in note else None
    return render.answer_message(text, note.get("stats", ""), sources, pages, flag)


def aligned(notes: list, num_turns: int) -> list:
    """``notes`` for the last ``num_turns`` turns (the conversation drops its oldest first), ``None`` for a turn
    without one."""
    kept = list(notes[-num_turns:]) if num_turns else []
    return [None] * (num_turns - len(kept)) + kept


def read_back(raw) -> list:
    """Notes from the tab's memory (the browser's: anything may be there), each a clean note or None."""
    if not isinstance(raw, list):
        return []
    return [_clean(item) for item in raw]


def _clean(item) -> dict | None:
    if not isinstance(item, dict) or not isinstance(item.get("stats"), str):
        return None
    note: dict = {"stats": item["stats"][:_MAX_NOTE_TEXT], "sources": []}
    for source in item.get("sources") or []:
        if (isinstance(source, list) and len(source) == 2 and isinstance(source[1], (int, float))
                and (source[0] is None or isinstance(source[0], str))):
            note["sources"].append([None if source[0] is None else source[0][:_MAX_NOTE_TEXT],
                                    min(max(float(source[1]), 0.0), 1.0)])
    unknown = item.get("unsupported")
    if isinstance(unknown, list):
        note["unsupported"] = [word[:_MAX_NOTE_TEXT] for word in unknown if isinstance(word, str)]
    return note
