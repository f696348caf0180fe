r"""Win32's 260-character paths (issue 50, item 4): the folders the studio writes under (its cache, a snapshot store,
and under them converted weights, saved snapshots and checkpoints) are made safe at the root. On Windows a root too
deep for the names made under it takes the ``\\?\`` form; Windows-shaped here (Linux has no such form), it is refused
with one message naming the setting, and a root just short enough keeps every file a read writes within the limit.
"""

from __future__ import annotations

import errno
import ntpath
import os
import types
from pathlib import Path

import pytest

from engine import SnapshotStore, paths_windows
from engine.paths import cache_dir
from engine.paths_windows import MAX_PATH, UNDER_CACHE, UNDER_STORE, long_form
from engine.store.files import TEMP_PREFIX
from engine.types import CheckpointPlan
from checkpoint_reads import WORDS, chunked_session
from tiny_sessions import words_text


def _root(tmp_path: Path, length: int) -> Path:
    """A folder under ``tmp_path`` whose path is ``length`` characters long."""
    path, left = str(tmp_path), length - len(str(tmp_path))
    while left > 0:
        step = min(left, 101)  # a separator and up to 100 characters
        step -= left - step == 1  # (never a last step of the separator alone)
        path, left = path + os.sep + "d" * (step - 1), left - step
    assert len(path) == length
    return Path(path)


def test_the_long_form_of_a_windows_path():
    assert long_form("C:\\Users\\ada\\..\\bob\\.cache") == "\\\\?\\C:\\Users\\bob\\.cache"
    assert long_form("C:/Users/ada/.cache") == "\\\\?\\C:\\Users\\ada\\.cache"
    assert long_form("\\\\nas\\share\\kv") == "\\\\?\\UNC\\nas\\share\\kv"
    assert long_form("\\\\?\\C:\\already") == "\\\\?\\C:\\already"


def test_a_cache_too_deep_for_its_names_is_refused_when_windows_shaped_naming_the_setting(tmp_path_factory,
                                                                                          monkeypatch):
    monkeypatch.setenv(paths_windows.ENV, "1")
    base = tmp_path_factory.mktemp("c")  # (a test's own tmp_path may be deeper than the roots wanted here)
    fits, deep = _root(base, MAX_PATH - 1 - UNDER_CACHE), _root(base, MAX_PATH - UNDER_CACHE)
    monkeypatch.setenv("HEADINFER_CACHE", str(fits))
    assert cache_dir() == fits
    monkeypatch.setenv("HEADINFER_CACHE", str(deep))
    with pytest.raises(OSError) as refused:
        cache_dir()
    assert refused.value.errno == errno.ENAMETOOLONG and refused.value.filename == str(deep)
    assert "LongPathsEnabled=1" in str(refused.value) and "set HEADINFER_CACHE to a short folder" in str(refused.value)
    monkeypatch.delenv(paths_windows.ENV)
    assert cache_dir() == deep  # Linux has no such limit


def test_a_store_just_short_enough_keeps_a_reads_checkpoints_and_snapshot_within_the_limit(tiny_dir, tmp_path,
                                                                                          monkeypatch):
    monkeypatch.setenv(paths_windows.ENV, "1")
    _, model, tokenizer = tiny_dir
    with pytest.raises(OSError, match="set --kv-cache-dir to a short folder"):
        SnapshotStore(_root(tmp_path, MAX_PATH - UNDER_STORE))
    root = _root(tmp_path, MAX_PATH - 1 - UNDER_STORE)
    store = SnapshotStore(root)
    session = chunked_session(model, tokenizer, words_text(11, WORDS))
    session.prefill(checkpoints=CheckpointPlan(store, every_chunks=1))  # (the last checkpoint stays: a partial read)
    written = [str(p) for p in root.rglob("*")]
    session.save_snapshot(store)
    written += [str(p) for p in root.rglob("*")]
    assert sum(name.endswith(".bin") for name in written) >= 2 * len(session.cache.layers)
    # Each was first written in a temporary folder (.tmp-<key>-<8 random>) in the snapshot's folder's place.
    assert max(map(len, written)) + len(TEMP_PREFIX) + len("-abcdefgh") < MAX_PATH


def test_on_windows_a_deep_root_takes_the_long_form_unless_long_paths_are_on(monkeypatch):
    monkeypatch.setattr(paths_windows, "os", types.SimpleNamespace(name="nt", path=ntpath, environ=os.environ))
    deep = Path("C:\\Users\\ada\\" + "d" * (MAX_PATH - UNDER_CACHE))
    monkeypatch.setattr(paths_windows, "long_paths_enabled", lambda: False)
    assert str(paths_windows.windows_path(deep, UNDER_CACHE, "HEADINFER_CACHE")) == f"\\\\?\\{deep}"
    short = Path("C:\\Users\\ada\\.cache\\headinfer-studio")
    assert paths_windows.windows_path(short, UNDER_CACHE, "HEADINFER_CACHE") == short
    monkeypatch.setattr(paths_windows, "long_paths_enabled", lambda: True)
    assert paths_windows.windows_path(deep, UNDER_CACHE, "HEADINFER_CACHE") == deep
