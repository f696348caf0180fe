"""The Windows-shaped mode (``HEADINFER_WINDOWS_SHAPED=1``) forces a Windows PC's choices on this Linux machine: no C
compiler (the torch paths, said in the log), no hard links (a snapshot copies the disk tier's files and restores
exactly), space reserved without ``posix_fallocate``, and at a process's start ``spawn`` and a pin limit."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_sessions import head_kv_bytes, home_files, open_session, tier_session, words_text

import process_env
from engine import SnapshotStore, paths_windows
from engine.cpu import gguf_blocks
from engine.errors import DiskTierError
from engine.kv.disk import DiskMemory
from engine.native import library

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def shaped(monkeypatch):
    monkeypatch.setenv(paths_windows.ENV, "1")


def test_the_switch_reads_one_variable(monkeypatch):
    assert process_env.WINDOWS_SHAPED == paths_windows.ENV
    for value, on in (("1", True), ("0", False), ("", False)):
        monkeypatch.setenv(paths_windows.ENV, value)
        assert paths_windows.windows_shaped() is on and paths_windows.windows_rules() is (on or os.name == "nt")


def test_no_compiler_when_windows_shaped_the_kernels_take_the_torch_path(shaped, monkeypatch, caplog):
    library._say_no_compiler.cache_clear()
    with caplog.at_level(logging.INFO, logger=library.__name__):
        assert library.compiler() is None
    assert "Windows-shaped" in caplog.text and "torch paths" in caplog.text
    assert gguf_blocks._built_kernel.__wrapped__() is None  # the GGUF kernel is not built: gguf-py's path runs
    monkeypatch.delenv(paths_windows.ENV)
    assert library.compiler() is not None or not any(os.path.exists(p) for p in ("/usr/bin/cc", "/usr/bin/gcc"))


def test_a_disk_tier_snapshot_copies_instead_of_linking_and_restores_exactly(tiny, tmp_path, shaped):  # noqa: F811
    model, tokenizer = tiny
    text = words_text(15, words=150)
    session = tier_session(model, tokenizer, text, tmp_path)
    store = SnapshotStore(tmp_path / "saved")
    info = session.save_snapshot(store)
    _, homes = home_files(store.root / info.key)
    tier = {os.stat(f).st_ino for f in (tmp_path / "tier").glob("kv-*/*.kv")}
    assert homes and all((store.root / info.key / f.name).stat().st_nlink == 1 for f in homes)
    assert not tier & {(store.root / info.key / f.name).stat().st_ino for f in homes}
    restored = open_session(model, tokenizer, text)
    assert restored.restore_snapshot(store) is not None
    assert all(torch.equal(a, b) for a, b in zip(head_kv_bytes(session), head_kv_bytes(restored)))


def test_disk_space_is_reserved_without_posix_fallocate(tmp_path, shaped):
    disk = DiskMemory(tmp_path)
    try:
        home = disk.empty((1000, 4, 8), torch.float16)
        home.fill_(1.5)
        (path,) = disk.folder.glob("*.kv")
        assert path.stat().st_size == 1000 * 4 * 8 * 2 and home.sum().item() == 1.5 * 32000
        with pytest.raises(DiskTierError, match="No space"):  # more than the disk holds: refused up front
            disk.empty((1 << 62,), torch.uint8)
    finally:
        disk.close()


def _started(environ: dict) -> dict:
    code = ("import json, multiprocessing, os, process_env; on = process_env.use_windows_shape();"
            "print(json.dumps([on, multiprocessing.get_start_method(), os.environ.get('HEADINFER_PIN_LIMIT')]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True,
                          timeout=60, check=True)
    return json.loads(done.stdout)


def test_the_start_sets_spawn_and_the_pin_limit_only_when_shaped():
    base = {k: v for k, v in os.environ.items() if k not in (process_env.WINDOWS_SHAPED, process_env.PIN_LIMIT_NAME)}
    assert _started({**base, process_env.WINDOWS_SHAPED: "1"}) == [True, "spawn", "64MiB"]
    limited = {**base, process_env.WINDOWS_SHAPED: "1", process_env.PIN_LIMIT_NAME: "1GiB"}
    assert _started(limited) == [True, "spawn", "1GiB"]
    assert _started(base) == [False, multiprocessing.get_all_start_methods()[0], None]  # the default, kept
