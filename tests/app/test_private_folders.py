"""Lower findings of issue 54: the app's temporary folders are this user's own (another user's folder of the same
name crashed start-up with PermissionError), and a closed tab's shelf is deleted only once its read has saved."""

from __future__ import annotations

import os
import stat
import threading

import gradio as gr

from app import cli
from app.browser_state import BrowserState
from app.handlers import Handlers
from app.uploads import own_folder, prepare_folder


def test_the_temporary_folders_are_named_for_this_user():
    uid = str(os.getuid())
    assert cli.UPLOADS.name == f"headinfer-studio-{uid}-uploads"
    assert cli.VISITOR_SHELVES.name == f"headinfer-studio-{uid}-visitors"


def test_a_new_folder_is_private_and_a_loose_one_of_ours_is_narrowed(tmp_path):
    mine = prepare_folder(tmp_path / "uploads")
    assert stat.S_IMODE((tmp_path / "uploads").stat().st_mode) == 0o700
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    os.chmod(loose, 0o777)
    assert own_folder(loose) == loose and stat.S_IMODE(loose.stat().st_mode) == 0o700


def test_another_users_folder_is_left_alone_and_a_fresh_private_one_used(tmp_path, caplog):
    theirs = tmp_path / "headinfer-studio-1000-uploads"
    theirs.mkdir()
    (theirs / "pid-1").mkdir()  # what they keep there stays theirs
    someone_else = os.getuid() + 1  # the folder, as seen by a user who does not own it
    folder = prepare_folder(theirs, uid=someone_else)
    assert not folder.is_relative_to(theirs) and folder.parent.parent == tmp_path
    assert folder.parent.name.startswith("headinfer-studio-1000-uploads-")
    assert stat.S_IMODE(folder.parent.stat().st_mode) == 0o700 and folder.is_dir()
    assert (theirs / "pid-1").is_dir()
    assert "belongs to another user" in caplog.text and str(theirs) in caplog.text


def test_a_link_in_place_of_the_folder_is_not_followed(tmp_path, caplog):
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "headinfer-studio-uploads"
    link.symlink_to(target)
    folder = prepare_folder(link)
    assert not folder.resolve().is_relative_to(target) and not any(target.iterdir())
    assert "is not a folder" in caplog.text


def test_a_closed_tabs_shelf_waits_for_its_read_to_finish_saving(tmp_path):
    handlers = Handlers(lambda: None, snapshot_store=_store(tmp_path), private=True,
                        session_shelves=tmp_path / "tabs")
    request = gr.Request(session_hash="tab-1")
    shelf = handlers.app.shelves.for_request(request)
    state = BrowserState()
    handlers.app.remember_tab(state, request)
    saving, saved = threading.Event(), threading.Event()

    def read_then_save() -> None:  # the read's event: it holds the tab busy while it saves onto the shelf
        with state.working():
            saving.set()
            saved.wait(10)
            (shelf.store.root / "studio-documents.json").write_text("the visitor's text")

    worker = threading.Thread(target=read_then_save)
    worker.start()
    saving.wait(10)
    handlers.unload(request)  # the tab closes while its read saves
    assert shelf.store.root.is_dir()  # not deleted under the save
    saved.set()
    worker.join(10)
    assert not shelf.store.root.exists()  # and gone once the save is done: the text did not survive
    assert state.when_closed is None


def test_an_idle_closed_tabs_shelf_goes_at_once(tmp_path):
    handlers = Handlers(lambda: None, snapshot_store=_store(tmp_path), private=True,
                        session_shelves=tmp_path / "tabs")
    request = gr.Request(session_hash="tab-2")
    shelf = handlers.app.shelves.for_request(request)
    handlers.app.remember_tab(BrowserState(), request)
    handlers.unload(request)
    assert not shelf.store.root.exists()


def _store(tmp_path):
    from engine import SnapshotStore

    return SnapshotStore(tmp_path / "kv")
