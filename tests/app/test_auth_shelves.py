"""Two people logged in with ``--auth-file``'s check (issue 54: a second login reopened the first person's document):
each has their own shelf, through Gradio's real login and the real handlers, SnapshotStore and embedded model; and a
visitor's save past their shelf's cap is refused whole, saying so."""

from __future__ import annotations

import os
import re

import gradio as gr
import pytest
from gradio_client import Client, handle_file
from ports import free_port

from app import auth, cli, startup
from app.browser_state import BrowserState
from app.handlers import Handlers
from app.visitor_caps import CapLimits


def _saved_keys(client: Client) -> list[str]:
    panel, _choice = client.predict(api_name="/saved")
    return re.findall(r'data-key="([0-9a-f]{32})"', panel)


@pytest.fixture
def serve_with_logins(embedded_model, tmp_path):
    """The app as launch.py starts it with ``--auth-file`` (two users); returns (url, owner store)."""
    from app.ui import build_ui, launch_options
    from app.uploads import prepare_folder
    from engine import DocumentSession, OffloadPolicy, SnapshotStore
    from engine.models.loader import describe

    model, tokenizer = embedded_model
    users = tmp_path / "users.txt"
    auth.add_user(users, "ada", "pw-ada")
    auth.add_user(users, "bob", "pw-bob")
    gate = cli.make_authenticator(cli.build_parser().parse_args(["--auth-file", str(users)]))
    previous = os.environ.get("GRADIO_TEMP_DIR")
    store = SnapshotStore(tmp_path / "kv")
    demo = build_ui(lambda: DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=64)),
                    model_info=describe(model), snapshot_store=store, private=True,
                    upload_dir=prepare_folder(tmp_path / "uploads"))
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                auth=gate.check, **startup.with_login_address(launch_options()))
    yield demo.local_url, store
    demo.close()
    if previous is None:
        os.environ.pop("GRADIO_TEMP_DIR", None)
    else:
        os.environ["GRADIO_TEMP_DIR"] = previous


@pytest.mark.slow
def test_two_people_logged_in_have_separate_shelves(serve_with_logins, secret_pdf):
    url, store = serve_with_logins
    with pytest.raises(Exception):  # noqa: B017 - gradio_client raises a bare ValueError for a refused login
        Client(url, auth=("ada", "pw-bob"), verbose=False)
    ada = Client(url, auth=("ada", "pw-ada"), verbose=False)
    try:
        ada.predict([handle_file(secret_pdf)], api_name="/upload")
        ada.submit(False, api_name="/read").result(timeout=600)  # a loaded CI machine
        keys = _saved_keys(ada)
    finally:
        ada.close()
    assert len(keys) == 1 and store.list() == []  # on ada's own shelf, not the owner's
    assert (store.root / "users").is_dir()
    bob = Client(url, auth=("bob", "pw-bob"), verbose=False)
    try:
        assert _saved_keys(bob) == []
        opened = bob.predict(keys[0], api_name="/open_saved")  # her key, which bob cannot have seen, guessed
        assert "cannot be opened" in str(opened) and "AMBER" not in str(opened)
        _panel, _choice, deleted = bob.predict(keys[0], api_name="/delete_saved")
        assert "no longer on disk" in deleted
    finally:
        bob.close()
    ada_again = Client(url, auth=("ada", "pw-ada"), verbose=False)
    try:
        assert _saved_keys(ada_again) == keys  # kept for her next visit, untouched by bob
    finally:
        ada_again.close()


@pytest.mark.slow
def test_a_save_past_a_visitors_shelf_cap_is_refused_whole(embedded_model, tmp_path, secret_pdf):
    from engine import DocumentSession, OffloadPolicy, SnapshotStore

    model, tokenizer = embedded_model
    store = SnapshotStore(tmp_path / "kv")  # the owner's: no cap of its own
    handlers = Handlers(lambda: DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=64)), store,
                        private=True, caps=CapLimits(shelf_bytes=64 * 2**10))
    request = gr.Request(username="ada", session_hash="ada-1")
    state = BrowserState()
    handlers.choose_files([secret_pdf], state, request)
    views = list(handlers.read(False, state, request))
    assert "Not saved for instant reopening: it would take more than the 64.00 KiB each visitor may keep" in \
        views[-1].status
    shelf = handlers.app.shelves.for_request(request)
    # Nothing half-written: no snapshot, no scratch folder (only the app's lock file on the shelf).
    assert shelf.list() == ([], None) and not [path for path in shelf.store.root.iterdir() if path.is_dir()]
    assert state.session.is_prefilled  # the read itself stands
