"""Names valid on NTFS: the helper every made name goes through (cache folders, sidecar files), and the app's
checks that differ on Windows: a process's liveness without ``os.kill`` (which terminates there), and the saved
folder's owner lock without ``fcntl.flock`` (forced by the Windows-shaped switch)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from save_owners import killed_save_is_counted_then_removed, live_owners_newer_save_is_left_alone

import process_env
from app import uploads
from app.saved import store_owner
from engine.errors import InputError
from engine.models.weights_cache import gguf_entry
from engine.paths_windows import MAX_NAME, is_ntfs_name, ntfs_name
from engine.store.files import check_sidecar_name


@pytest.mark.parametrize("name", ["SmolLM2-135M-Instruct", "model.Q4_K_M", "Qwen2.5-1M", "con-fig", "nullify.txt",
                                  "COM10", "a b", ".hidden"])
def test_a_valid_name_is_kept_as_it_is(name):
    assert ntfs_name(name) == name and is_ntfs_name(name)


@pytest.mark.parametrize(("name", "expected"), [
    ("qwen3:8b", "qwen3_8b"), ('a<b>c"d|e?f*g', "a_b_c_d_e_f_g"), ("dir/sub\\x", "dir_sub_x"),
    ("tab\there", "tab_here"),
    ("notes.", "notes"), ("trailing . ", "trailing"), ("...", "_"), ("", "_"),
    ("CON", "_CON"), ("con.txt", "_con.txt"), ("Nul .tar.gz", "_Nul .tar.gz"), ("com1", "_com1"),
    ("LPT9.log", "_LPT9.log"), ("COM\u00b9", "_COM\u00b9"), ("aux:", "aux_"), ("CONIN$", "_CONIN$"),
])
def test_an_invalid_name_is_made_valid(name, expected):
    assert ntfs_name(name) == expected and is_ntfs_name(expected) and not is_ntfs_name(name)
    assert ntfs_name(expected) == expected  # once is enough


def test_a_long_name_is_cut_and_two_long_names_stay_apart():
    first, second = "x" * 300 + "-a", "x" * 300 + "-b"
    assert len(ntfs_name(first)) == MAX_NAME and ntfs_name(first) != ntfs_name(second)
    assert ntfs_name(first) == ntfs_name(first) and is_ntfs_name(ntfs_name(first))


def test_a_cache_folder_named_from_a_file_is_valid_on_ntfs(tmp_path):
    gguf = tmp_path / "qwen3:8b-q4.gguf"
    gguf.write_bytes(b"GGUF")
    entry = gguf_entry(tmp_path / "models", gguf, "qwen3:8b-q4")
    assert entry.folder.name.startswith("qwen3_8b-q4-gguf-") and is_ntfs_name(entry.folder.name)
    plain = gguf_entry(tmp_path / "models", gguf, "SmolLM2-135M")
    assert plain.folder.name.startswith("SmolLM2-135M-gguf-")  # a valid name: the folder Linux made before


@pytest.mark.parametrize("name", ["aux.txt", "notes.", "NUL", "com3.json"])
def test_a_sidecar_name_windows_cannot_hold_is_refused(name):
    with pytest.raises(InputError, match="not a sidecar file name"):
        check_sidecar_name(name)


def test_a_valid_sidecar_name_is_taken():
    check_sidecar_name("chat-turns.json")


def test_a_process_is_found_alive_or_gone_without_signalling_it():
    assert uploads._is_running(uploads.os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    assert not uploads._is_running(child.pid)  # reaped: no process of that id (reuse within a test is negligible)


@pytest.mark.parametrize("check", [killed_save_is_counted_then_removed, live_owners_newer_save_is_left_alone],
                         ids=["killed-owner", "live-owner"])
def test_without_flock_a_lock_is_owned_by_its_live_process(check, tmp_path, monkeypatch):
    monkeypatch.setenv(process_env.WINDOWS_SHAPED, "1")  # Windows' path: no fcntl, the lock's process id and start time
    assert not store_owner._can_flock()
    check(tmp_path)
    lock = tmp_path / f"{store_owner.LOCK_PREFIX}{os.getpid()}.lock"  # a later process given a dead owner's id
    lock.write_text("")
    os.utime(lock, (time.time() - 10**6, time.time() - 10**6))
    assert not store_owner._owner_alive(lock)
