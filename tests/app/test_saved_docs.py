"""Saved documents: the app saves a read document's KV cache to disk, reopens it in a new browser
session without reading, lists and deletes what is saved, and survives a disk that fails.

Real SmolLM2, real PDFs, and a store in tmp_path (never the user's cache folder).
"""

from __future__ import annotations

import errno
import re
import socket

import pytest
from gradio_client import Client, handle_file

from app.browser_state import BrowserState
from app.handlers import Handlers
from app.ui import build_ui
from engine import DocumentSession, OffloadPolicy, SnapshotStore
from engine.models.loader import describe

pytestmark = pytest.mark.slow

QUESTION = "What is the secret launch code of the lighthouse?"
ANSWER_TOKENS = 16


class CountingSession(DocumentSession):
    """Counts prefills, so a test can tell a reopened document from one read again."""

    prefills = 0

    def prefill(self, on_progress=None, should_stop=None, **kwargs):
        CountingSession.prefills += 1
        return super().prefill(on_progress, should_stop, **kwargs)


@pytest.fixture
def store(tmp_path):
    return SnapshotStore(tmp_path / "kv")


@pytest.fixture
def make_handlers(embedded_model):
    model, tokenizer = embedded_model

    def make(store: SnapshotStore | None) -> Handlers:
        return Handlers(lambda: CountingSession(model, tokenizer, OffloadPolicy(chunk_size=32)), store)

    return make


def _text(html_text) -> str:
    return re.sub(r"<[^>]+>", "", str(html_text))


def _read(handlers: Handlers, pdf: str, state: BrowserState | None = None) -> tuple[BrowserState, list]:
    state = state or BrowserState()
    handlers.choose_files([pdf], state)
    return state, list(handlers.read(False, state))


def _answer(handlers: Handlers, state: BrowserState) -> str:
    list(handlers.ask(QUESTION, [], ANSWER_TOKENS, 0.0, state))
    return state.session.turns[-1].answer


def _keys(view) -> list[str]:
    return [key for _, key in view.choice["choices"]]


def test_read_saves_then_a_new_session_reopens_without_reading(make_handlers, store, secret_pdf):
    handlers = make_handlers(store)
    first, views = _read(handlers, secret_pdf)
    assert 'data-state="done"' in views[-1].progress
    assert "Saved for instant reopening" in _text(views[-1].status)
    original = _answer(handlers, first)

    listed = handlers.saved()
    [info] = store.list()
    assert _keys(listed) == [info.key] and info.label == "lighthouse.pdf"
    assert 'data-count="1"' in listed.panel and "lighthouse.pdf" in listed.panel
    assert f"{info.num_tokens:,}" in listed.panel and "no size limit" in listed.panel

    CountingSession.prefills = 0
    second, views = _read(handlers, secret_pdf)  # another browser tab, same file
    assert CountingSession.prefills == 0
    assert 'data-state="reopening"' in views[0].progress
    assert 'data-state="done"' in views[-1].progress and "reopened from disk" in views[-1].progress
    assert re.search(r"Reopened from disk in \d+\.\d+ s \(\d+\.\d\d [KMG]iB/s\) — no reading needed",
                     _text(views[-1].status))
    assert second.session.is_prefilled and second.session is not first.session
    assert _answer(handlers, second) == original  # greedy: the same K/V gives the same answer


def test_delete_removes_it_from_the_list_and_the_disk(make_handlers, store, secret_pdf):
    handlers = make_handlers(store)
    state, _ = _read(handlers, secret_pdf)
    [key] = _keys(handlers.saved())
    view = handlers.delete_saved(key)
    assert "Deleted “lighthouse.pdf”" in _text(view.status)
    assert _keys(view) == [] and 'data-count="0"' in view.panel
    assert store.list() == [] and store.total_bytes() == 0
    assert state.session.is_prefilled  # the loaded document is untouched
    with pytest.warns(UserWarning, match="no longer on disk"):
        handlers.delete_saved(key)
    with pytest.warns(UserWarning, match="Choose a saved document"):
        handlers.delete_saved(None)


def test_setting_off_saves_and_reopens_nothing(make_handlers, store, secret_pdf):
    handlers = make_handlers(store)
    state = BrowserState()
    handlers.set_remember(False, state)
    _, views = _read(handlers, secret_pdf, state)
    assert 'data-state="done"' in views[-1].progress
    assert "Saved" not in _text(views[-1].status) and store.list() == []

    _read(handlers, secret_pdf)  # another tab, with the setting on, saves it
    assert len(store.list()) == 1
    CountingSession.prefills = 0
    other = BrowserState(remember=False)
    _read(handlers, secret_pdf, other)
    assert CountingSession.prefills == 1 and other.session.is_prefilled  # read, not reopened


def test_without_a_store_nothing_is_saved_or_listed(make_handlers, secret_pdf):
    handlers = make_handlers(None)
    _, views = _read(handlers, secret_pdf)
    assert _text(views[-1].status).startswith("Read ") and "Saved" not in _text(views[-1].status)
    view = handlers.saved()
    assert "turned off" in view.panel and _keys(view) == []


def _disk_full(store: SnapshotStore, monkeypatch) -> None:
    def save(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "save", save)


def _folder_gone(store: SnapshotStore, monkeypatch) -> None:
    store.root.rmdir()
    store.root.write_text("not a folder any more")  # every write under it now fails


@pytest.mark.parametrize(("break_store", "reason"), [(_disk_full, "the disk is full"),
                                                     (_folder_gone, "Not a directory")])
def test_a_failing_disk_is_reported_and_the_document_still_answers(make_handlers, store, secret_pdf,
                                                                   monkeypatch, break_store, reason):
    break_store(store, monkeypatch)
    handlers = make_handlers(store)
    with pytest.warns(UserWarning, match="Could not save"):
        state, views = _read(handlers, secret_pdf)
    message = _text(views[-1].status)
    assert "Could not save it for instant reopening" in message and reason in message
    assert "the documents stay loaded" in message and 'data-kind="warn"' in views[-1].status
    assert 'data-state="done"' in views[-1].progress
    assert state.session.is_prefilled and _answer(handlers, state)
    handlers.saved()  # listing a broken folder shows a message, never raises


def test_over_the_cap_is_not_saved_and_says_why(make_handlers, tmp_path, secret_pdf):
    store = SnapshotStore(tmp_path / "kv", max_bytes=1000)
    _, views = _read(make_handlers(store), secret_pdf)
    assert "Not saved for instant reopening" in _text(views[-1].status) and store.list() == []


def test_damaged_snapshot_falls_back_to_reading(make_handlers, store, secret_pdf):
    handlers = make_handlers(store)
    _read(handlers, secret_pdf)
    [info] = store.list()
    for path in info.path.iterdir():
        if path.name.startswith("layer"):
            path.write_bytes(path.read_bytes()[:100])  # truncated on disk
            break
    else:
        pytest.fail(f"no layer file in {sorted(p.name for p in info.path.iterdir())}")
    CountingSession.prefills = 0
    state, views = _read(handlers, secret_pdf)
    assert CountingSession.prefills == 1 and state.session.is_prefilled
    assert any("could not be used" in _text(view.status) for view in views)
    assert "Saved for instant reopening" in _text(views[-1].status)  # saved again, intact this time
    assert _answer(handlers, state)


# -- the named API endpoints -------------------------------------------------------------------------
def test_saved_and_delete_saved_endpoints(embedded_model, store, secret_pdf):
    model, tokenizer = embedded_model
    demo = build_ui(lambda: DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=32)),
                    model_info=describe(model), snapshot_store=store)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    client = Client(demo.local_url, verbose=False)
    try:
        client.predict([handle_file(secret_pdf)], api_name="/upload")
        job = client.submit(False, api_name="/read")
        job.result(timeout=120)
        assert "Saved for instant reopening" in job.outputs()[-1][1]
        panel, choice = client.predict(api_name="/saved")
        [key] = [info.key for info in store.list()]
        assert "lighthouse.pdf" in panel and key in str(choice)
        panel, _, status = client.predict(key, api_name="/delete_saved")
        assert 'data-count="0"' in panel and "Deleted" in status and store.list() == []
    finally:
        client.close()
        demo.close()


def test_a_document_read_through_the_disk_tier_is_saved_by_linking_and_reopens(embedded_model, store, secret_pdf,
                                                                                 tmp_path):
    model, tokenizer = embedded_model
    probe, _ = _read(Handlers(lambda: DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=32)), None),
                     secret_pdf)
    host, kv = probe.session.cache.plan.host_bytes, probe.session.cache.kv_bytes()["host"]
    original = _answer(Handlers(lambda: None, None), probe)
    # Three quarters of the KV beyond the RAM budget: those homes live in files under tier/.
    policy = OffloadPolicy(chunk_size=32, disk_dir=str(tmp_path / "tier"), host_memory=host - kv * 3 // 4)
    handlers = Handlers(lambda: CountingSession(model, tokenizer, policy), store)
    first, views = _read(handlers, secret_pdf)
    assert first.session.cache.kv_bytes()["disk"] > 0
    assert "Saved for instant reopening" in _text(views[-1].status)
    [info] = store.list()
    home_files = list((store.root / info.key).glob("layer-*-group-*"))
    assert home_files and all(f.stat().st_nlink == 2 for f in home_files)  # the tier's own files, linked
    assert _answer(handlers, first) == original  # exact: the disk tier changes where K/V lives, not what it is

    CountingSession.prefills = 0
    second, views = _read(handlers, secret_pdf)  # another tab reopens it from the snapshot
    assert CountingSession.prefills == 0 and "reopened from disk" in views[-1].progress
    assert _answer(handlers, second) == original
