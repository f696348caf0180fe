"""Visitors kept apart when others can reach the app, uploads deleted with their tab, inert answers."""

from __future__ import annotations

import os
import re
import time
import urllib.request
from types import SimpleNamespace

import pytest
from gradio_client import Client, handle_file
from ports import free_port

from app.browser_state import BrowserState
from app.handlers import Handlers
from app.render import model_markdown
from app.uploads import delete_uploads, prepare_folder
from engine.types import AnswerChunk

EVIL = "The code is ![pixel](https://tracker.example/p.png) <img src=https://tracker.example/a.png>."


# -- fast: no model -------------------------------------------------------------------------------
def test_model_markdown_cannot_embed_remote_images():
    text = model_markdown(EVIL + ' <div style="background:url(https://t.example)">x</div> 3 < 4')
    assert "![" not in text and "<img" not in text and "<div" not in text
    assert "[pixel](https://tracker.example/p.png)" in text and "3 < 4" in text  # a plain link, the text kept


class _ParrotSession:
    """Stands in for a read session whose model repeats what a hostile document told it to."""

    is_prefilled = True
    document, dropped_turns, document_tokens = "", 0, 0

    def fit_question(self, question, max_new_tokens):
        return SimpleNamespace(num_dropped=0, ids=question.split())  # a ConversationFit's fields

    def count_tokens(self, text):
        return len(text.split())

    @property
    def read_time(self):  # the session's read estimates (``engine.read_time.ReadEstimator``): this fake's own
        return self

    def estimate_prefill_seconds(self, num_tokens, start=0):
        return 0.0

    def conversation(self):  # the turns it recorded: none (the app keeps a turn's notes only for recorded turns)
        return []

    def ask(self, question, **kwargs):
        yield AnswerChunk(EVIL, EVIL, 9, 0.1, 10.0, done=False)
        yield AnswerChunk(EVIL, "", 9, 0.1, 10.0, done=True)


def test_answers_in_the_chat_fetch_no_remote_image():
    state = BrowserState(session=_ParrotSession())
    views = list(Handlers(lambda: None).ask("What is the code?", [], 16, 0.0, state))
    answer = views[-1].chat[-1]["content"]
    assert "![" not in answer and "<img" not in answer and "tracker.example/p.png" in answer


def test_stale_upload_folders_go_at_start_up_and_only_uploads_are_deleted(tmp_path):
    root = tmp_path / "uploads"
    stale, alive = root / "pid-999999999", root / f"pid-{os.getppid()}"
    for folder in (stale, alive):
        (folder / "abc").mkdir(parents=True)
        (folder / "abc" / "book.txt").write_text("x")
    mine = prepare_folder(root)
    assert mine == root / f"pid-{os.getpid()}" and mine.is_dir()
    assert not stale.exists() and alive.exists()  # another running app's uploads are left alone
    (mine / "h1").mkdir()
    upload = mine / "h1" / "book.txt"
    upload.write_text("x")
    outside = tmp_path / "precious.txt"
    outside.write_text("keep")
    assert delete_uploads([str(upload), str(outside), str(mine / ".." / ".." / "precious.txt")], mine) == 1
    assert not upload.exists() and not (mine / "h1").exists() and outside.exists() and mine.is_dir()


# -- through gradio_client, on the embedded model ---------------------------------------------------
@pytest.fixture
def serve(embedded_model, tmp_path):
    """Starts the app as ``launch.py`` would when others can reach it; returns (url, owner store, folders)."""
    from app.ui import build_ui, launch_options
    from engine import DocumentSession, OffloadPolicy, SnapshotStore
    from engine.models.loader import describe

    model, tokenizer = embedded_model
    demos, previous = [], os.environ.get("GRADIO_TEMP_DIR")

    def start(auth=None):
        store = SnapshotStore(tmp_path / "kv")
        uploads, shelves = prepare_folder(tmp_path / "uploads"), prepare_folder(tmp_path / "visitors")
        demo = build_ui(lambda: DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=64)),
                        model_info=describe(model), snapshot_store=store, private=True, upload_dir=uploads,
                        session_shelves=None if auth else shelves)
        demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                    auth=auth, **launch_options())
        demos.append(demo)
        return demo.local_url, store, uploads, shelves

    yield start
    for demo in demos:
        demo.close()
    if previous is None:
        os.environ.pop("GRADIO_TEMP_DIR", None)
    else:
        os.environ["GRADIO_TEMP_DIR"] = previous


def _read(client: Client, pdf: str) -> None:
    client.predict([handle_file(pdf)], api_name="/upload")
    client.submit(False, api_name="/read").result(timeout=180)


def _saved_keys(client: Client) -> list[str]:
    panel, _choice = client.predict(api_name="/saved")
    return re.findall(r'data-key="([0-9a-f]{32})"', panel)


@pytest.mark.slow
def test_demo_mode_visitors_neither_see_nor_delete_each_others_documents(serve, secret_pdf):
    url, store, uploads, shelves = serve()
    with urllib.request.urlopen(url) as response:  # and no page may load images from elsewhere
        assert "img-src 'self'" in response.headers["content-security-policy"]
    ada, bob = Client(url, verbose=False), Client(url, verbose=False)
    try:
        _read(ada, secret_pdf)
        keys = _saved_keys(ada)
        assert len(keys) == 1 and store.list() == []  # saved on ada's tab shelf, not the owner's
        assert list(uploads.rglob("lighthouse.pdf"))  # her upload, until her tab closes
        assert _saved_keys(bob) == []
        _panel, _choice, status = bob.predict(keys[0], api_name="/delete_saved")
        assert "no longer on disk" in status and _saved_keys(ada) == keys
    finally:
        bob.close()
        ada.close()
    deadline = time.monotonic() + 60  # the server notices the closed tabs
    while list(uploads.rglob("lighthouse.pdf")) or any(shelves.iterdir()):
        assert time.monotonic() < deadline, (list(uploads.rglob("*")), list(shelves.iterdir()))
        time.sleep(0.5)


@pytest.mark.slow
def test_logged_in_visitors_keep_their_own_documents(serve, secret_pdf):
    url, store, _uploads, _shelves = serve(auth=[("ada", "pw-ada"), ("bob", "pw-bob")])
    ada = Client(url, auth=("ada", "pw-ada"), verbose=False)
    try:
        _read(ada, secret_pdf)
        keys = _saved_keys(ada)
    finally:
        ada.close()
    assert len(keys) == 1 and store.list() == []
    bob, ada_again = Client(url, auth=("bob", "pw-bob"), verbose=False), Client(url, auth=("ada", "pw-ada"),
                                                                                 verbose=False)
    try:
        assert _saved_keys(bob) == []
        assert _saved_keys(ada_again) == keys  # kept for her next visit
    finally:
        bob.close()
        ada_again.close()
