"""“Read documents” is enabled exactly when pressing it reads something new (issue 51): one rule
(``app.read_offer.can_read``) that each handler answers with and the page asks again (``Handlers.read_offer``) after
every event that changes what it would read. Real SmolLM2, real PDFs; a session whose documents may take 224 tokens,
so that a four-page PDF is too long and one of its pages fits."""

from __future__ import annotations

import re

import pytest
from make_files import make_pdf

from app.browser_state import BrowserState
from app.handlers import Handlers
from engine import DocumentSession, OffloadPolicy, SnapshotStore

pytestmark = pytest.mark.slow

CONTEXT, ANSWERS = 288, 64  # documents' share: 224 tokens


@pytest.fixture
def make_handlers(embedded_model):
    model, tokenizer = embedded_model

    def make(session_class=DocumentSession, store: SnapshotStore | None = None) -> Handlers:
        policy = OffloadPolicy(chunk_size=16, max_context=CONTEXT)
        return Handlers(lambda: session_class(model, tokenizer, policy, answer_budget=ANSWERS), store)

    return make


@pytest.fixture
def handlers(make_handlers):
    return make_handlers()


@pytest.fixture
def long_pdf(tmp_path):
    """Four pages of about 90 tokens each: too long whole, a page fits."""
    return str(make_pdf(tmp_path / "tides.pdf", [f"Chapter {n}. " + "The tide rises and falls twice a day. " * 9
                                                 for n in range(4)]))


@pytest.fixture
def other_pdf(tmp_path):
    return str(make_pdf(tmp_path / "storms.pdf", ["Storms come in autumn; the ships keep away from the reef."]))


def _on(update) -> bool:
    return update["interactive"]


def _text(html) -> str:
    return re.sub(r"<[^>]+>", "", str(html))


def test_read_once_then_not_again_until_the_set_changes(handlers, secret_pdf, other_pdf):
    state = BrowserState()
    assert _on(handlers.choose_files([secret_pdf], state).read_button)
    views = list(handlers.read(False, state))
    assert 'data-state="done"' in views[-1].progress and not _on(views[-1].read_button)
    assert not _on(handlers.read_offer(False, state)) and not _on(handlers.read_offer(True, state))
    assert not _on(handlers.choose_files([secret_pdf], state).read_button)  # the same set again: read already
    assert _on(handlers.choose_files([secret_pdf, other_pdf], state).read_button)  # a file added
    assert not _on(handlers.choose_files([secret_pdf], state).read_button)  # removed again: the set read
    assert _on(handlers.choose_files([other_pdf], state).read_button)  # another set
    assert not _on(handlers.choose_files(None, state).read_button)  # none


def test_too_long_is_offered_only_truncated_or_as_a_range_that_fits(handlers, long_pdf):
    state = BrowserState()
    view = handlers.choose_files([long_pdf], state)
    assert 'data-fits="false"' in view.plan and view.truncate["visible"] is True
    assert not _on(view.read_button)  # Truncate off, no range: pressing it would read nothing
    assert _on(handlers.read_offer(True, state))  # Truncate ticked
    assert not _on(handlers.read_offer(False, state))  # and unticked
    with pytest.warns(UserWarning, match="Cannot read"):  # pressed anyway (the API): refused, and still off
        refused = list(handlers.read(False, state))
    assert not _on(refused[-1].read_button) and not state.session.document_tokens

    handlers.range_offer(state)
    chosen = handlers.choose_range(1, 1, state)  # one page: fits
    assert _on(chosen.read_button) and _on(handlers.read_offer(False, state))
    handlers.choose_range(0, 3, state)  # the whole book again: too long, nothing chosen that fits
    assert not _on(handlers.read_offer(False, state))
    handlers.choose_range(1, 1, state)
    views = list(handlers.read(False, state))
    assert 'data-state="done"' in views[-1].progress and not _on(views[-1].read_button)
    again = handlers.choose_range(1, 1, state)  # the range read, chosen again
    assert not _on(again.read_button) and not _on(handlers.read_offer(False, state))
    assert _on(handlers.choose_range(2, 2, state).read_button)  # another page


def test_a_stopped_or_failed_read_offers_the_rest(make_handlers, long_pdf, tmp_path):
    class OutOfMemoryOnce(DocumentSession):
        fail = True

        def prefill(self, on_progress=None, should_stop=None, **kwargs):
            if OutOfMemoryOnce.fail:
                OutOfMemoryOnce.fail = False
                raise MemoryError("out of memory while reading 16 tokens")
            return super().prefill(on_progress, should_stop, **kwargs)

    handlers = make_handlers(OutOfMemoryOnce)
    state = BrowserState()
    handlers.choose_files([long_pdf], state)
    with pytest.warns(UserWarning, match="out of memory"):
        failed = list(handlers.read(True, state))
    assert 'data-state="failed"' in failed[-1].progress and _on(failed[-1].read_button)
    assert _on(handlers.read_offer(False, state))  # Truncate unticked since: the rest is still to read

    reading = handlers.read(True, state)
    next(reading)
    handlers.cancel(state)
    stopped = list(reading)
    assert 'data-state="cancelled"' in stopped[-1].progress and _on(stopped[-1].read_button)
    assert not state.session.is_prefilled and _on(handlers.read_offer(False, state))
    assert not _on(list(handlers.read(True, state))[-1].read_button)  # read to the end


def test_cleared_documents_are_not_offered(handlers, secret_pdf):
    state = BrowserState()
    handlers.choose_files([secret_pdf], state)
    assert _on(handlers.read_offer(False, state))
    handlers.clear(state)  # its view has no button: the page asks the rule after it
    assert not _on(handlers.read_offer(False, state)) and not _on(handlers.read_offer(True, state))


def test_a_reopened_saved_document_is_not_offered(make_handlers, secret_pdf, tmp_path):
    store = SnapshotStore(tmp_path / "kv")
    handlers = make_handlers(store=store)
    first = BrowserState()
    handlers.choose_files([secret_pdf], first)
    list(handlers.read(False, first))
    key = handlers.saved().choice["value"]
    assert key

    tab = BrowserState()
    views = list(handlers.open_saved(key, tab))
    assert "Reopened" in _text(views[-1].status) and not _on(views[-1].read_button)
    # the plan says what the open cost, not a forecast of a read that will not happen ("≈ –")
    assert re.search(r"<span>Reading time</span><b>reopened from disk in [0-9.]+ (s|ms)</b>", views[-1].plan)
    assert not _on(handlers.read_offer(False, tab)) and not _on(handlers.read_offer(True, tab))
    again = BrowserState()  # its files dropped again in a third tab: reopened from disk by the read
    assert _on(handlers.choose_files([secret_pdf], again).read_button)
    views = list(handlers.read(False, again))
    assert "Reopened from disk" in _text(views[-1].status) and not _on(views[-1].read_button)


def test_a_running_read_or_answer_keeps_the_button(handlers, secret_pdf):
    state = BrowserState()
    handlers.choose_files([secret_pdf], state)
    state.is_busy = True  # Truncate ticked meanwhile: the running work owns the button; the page asks after it
    assert "interactive" not in handlers.read_offer(True, state)
    state.is_busy = False
    assert _on(handlers.read_offer(True, state))
