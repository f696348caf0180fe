"""The status lines and panels a newcomer reads, true to what happened: the files table of a reopened page range,
page chips of the previous document gone after a new read, Open with one saved document, "Writing the answer" once
the question is read, and a queue wait that counts the running answer's remaining tokens down.

Real SmolLM2 and PDFs; saved documents in tmp_path."""

from __future__ import annotations

import re

import pytest
from make_files import make_pdf

from app import render
from app.browser_state import BrowserState
from app.compute_queue import ComputeQueue
from app.handlers import Handlers
from engine import DocumentSession, OffloadPolicy, SnapshotStore

pytestmark = pytest.mark.slow

PAGE = "The keeper climbed the stairs and trimmed the wick before the storm. " * 22  # ~300 tokens


@pytest.fixture
def make_handlers(embedded_model, tmp_path):
    model, tokenizer = embedded_model

    def make(**options) -> Handlers:
        return Handlers(lambda: DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=256)), **options)

    return make


def _text(html_text) -> str:
    return re.sub(r"<[^>]+>", "", str(html_text))


def test_a_reopened_page_range_shows_its_own_pages_and_characters_not_the_books(make_handlers, tmp_path):
    handlers = make_handlers(snapshot_store=SnapshotStore(tmp_path / "kv"))
    book = make_pdf(tmp_path / "book.pdf", [f"Chapter {i}. {PAGE}" for i in range(30)])
    state = BrowserState()
    view = handlers.choose_files([str(book)], state)
    assert 'data-fits="false"' in view.plan and state.pieces  # too long whole: a page range is offered
    whole = re.search(r'<td class="file-name">book.pdf</td><td>30</td><td>([\d,]+)</td>', view.table)
    handlers.choose_range(2, 4, state)
    list(handlers.read(False, state))
    assert state.session.is_prefilled and state.saved_key

    opened = BrowserState()
    [*_, last] = handlers.open_saved(None, opened)  # one saved document: no choosing
    assert "Reopened" in _text(last.status), _text(last.status)
    row = re.search(r'<td class="file-name">book.pdf</td><td>(\d+)</td><td>([\d,]+)</td><td>([\d,]+)</td>', last.table)
    assert row is not None, last.table
    pages, chars, tokens = (int(group.replace(",", "")) for group in row.groups())
    assert pages == 3 and chars < int(whole.group(1).replace(",", "")) / 5
    assert tokens <= opened.session.document_tokens < tokens + 128  # the range's tokens (and the prompt's)
    assert last.pages["visible"] is False and last.pages["choices"] == []  # no chips of another document


def test_with_one_saved_document_open_needs_no_choice_and_the_list_preselects_it(make_handlers, tmp_path, secret_pdf):
    handlers = make_handlers(snapshot_store=SnapshotStore(tmp_path / "kv"))
    state = BrowserState()
    handlers.choose_files([secret_pdf], state)
    list(handlers.read(False, state))
    listed = handlers.saved()
    assert listed.choice["value"] == state.saved_key  # preselected: Open opens it
    [*_, last] = handlers.open_saved(None, BrowserState())
    assert "Reopened lighthouse.pdf" in _text(last.status)

    other = make_pdf(tmp_path / "other.pdf", ["A second book about tides."])
    two = BrowserState()
    handlers.choose_files([str(other)], two)
    list(handlers.read(False, two))
    assert handlers.saved().choice["value"] is None  # two: the visitor chooses
    [*_, last] = handlers.open_saved(None, BrowserState())
    assert "Choose a saved document" in _text(last.status)


def test_a_new_read_clears_the_previous_documents_page_chips(make_handlers, secret_pdf, tmp_path):
    handlers = make_handlers()
    state = BrowserState()
    handlers.choose_files([secret_pdf], state)
    list(handlers.read(False, state))
    handlers.choose_files([str(make_pdf(tmp_path / "tides.pdf", ["Tides rise twice a day.", "And fall."]))], state)
    views = list(handlers.read(False, state))
    cleared = [v for v in views if isinstance(v.pages, dict) and v.pages.get("choices") == []]
    assert cleared and cleared[0].pages["visible"] is False and cleared[0].page == render.page_view(None)


def test_once_the_answer_is_written_the_status_no_longer_says_reading_the_question(make_handlers, secret_pdf):
    handlers = make_handlers()
    state = BrowserState()
    handlers.choose_files([secret_pdf], state)
    list(handlers.read(False, state))
    lines = [_text(view.status) for view in handlers.ask("What is the launch code?", [], 24, 0.0, state)
             if isinstance(view.status, str)]
    reading = [i for i, line in enumerate(lines) if line.startswith("Reading the question")]
    writing = [i for i, line in enumerate(lines) if line.startswith("Writing the answer")]
    assert writing and (not reading or reading[-1] < writing[0]), lines
    assert lines[-1].startswith("TTFT"), lines  # and the answer's own line at the end


class _Chunk:
    def __init__(self, num_tokens: int, tokens_per_second: float):
        self.num_tokens, self.tokens_per_second = num_tokens, tokens_per_second


def test_the_wait_behind_an_answer_counts_its_remaining_tokens_and_counts_down(monkeypatch):
    import app.compute_queue as compute_queue

    clock = [100.0]
    monkeypatch.setattr(compute_queue.time, "monotonic", lambda: clock[0])
    handlers = Handlers(lambda: None, compute_queue=ComputeQueue())
    handlers.app.answers.lengths.extend([120, 100, 140])  # the last answers: 120 tokens, typically
    queue = handlers.app.queue
    answering = queue.join("answering a question", 8.2)
    waiting = queue.join("answering a question", 8.2)
    queue.expect(answering, handlers.questions._answer_left(_Chunk(20, 10.0), 512))  # 100 tokens to go at 10 tok/s
    assert queue.wait_seconds(waiting) == pytest.approx(10.0)
    clock[0] += 4.0
    assert queue.wait_seconds(waiting) == pytest.approx(6.0)  # counts down between updates
    queue.expect(answering, handlers.questions._answer_left(_Chunk(90, 10.0), 512))  # 30 to go
    assert queue.wait_seconds(waiting) == pytest.approx(3.0)
    # Past the usual length, at most what its limit allows
    assert 0 < handlers.questions._answer_left(_Chunk(510, 10.0), 512) <= 0.2


def test_the_wait_counts_down_steadily_through_the_rates_jitter(monkeypatch):
    """An answer's estimate moves by a few percent with each token; the wait shown counts down through that and
    takes a new estimate only when it is more than 10% (or a second) off."""
    import app.compute_queue as compute_queue

    clock = [100.0]
    monkeypatch.setattr(compute_queue.time, "monotonic", lambda: clock[0])
    queue = ComputeQueue()
    answering = queue.join("answering a question", 20.0)
    waiting = queue.join("answering a question", 20.0)
    queue.expect(answering, 300.0)  # the first rate: 300 s to go
    shown = [queue.wait_seconds(waiting)]
    for estimate in (319.0, 304.0, 325.0, 315.0):  # the rate's jitter, one estimate a second
        clock[0] += 1.0
        queue.expect(answering, estimate)
        shown.append(queue.wait_seconds(waiting))
    assert shown == [300.0, 299.0, 298.0, 297.0, 296.0]
    clock[0] += 1.0
    queue.expect(answering, 200.0)  # far off: taken
    assert queue.wait_seconds(waiting) == pytest.approx(200.0)
