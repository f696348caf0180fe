"""A document read through the disk tier is saved already: its snapshot links the tier's files, exactly.

The save writes the RAM homes' K/V and links the disk homes' files (no byte of theirs copied); the link holds
only the document's rows, which are never written again: answers append past them, a new document moves the
home to a fresh file first, and closing the tier trims the snapshot's files to their prefix.
"""

from __future__ import annotations

import errno
import os
import zlib

import pytest
import torch
from tiny_sessions import answer_text, head_kv_bytes, home_files, open_session, tier_policy, tier_session, words_text

from engine import SnapshotStore
from engine.kv import disk as disk_module
from engine.kv.disk import DiskMemory


@pytest.mark.parametrize("kv_dtype", [None, "int8"], ids=["exact", "int8"])
def test_the_snapshot_links_the_disk_homes_and_restores_exactly(tiny, tmp_path, kv_dtype):
    model, tokenizer = tiny
    text = words_text(11, words=150)
    policy = {"kv_dtype": kv_dtype} if kv_dtype else {}
    session = tier_session(model, tokenizer, text, tmp_path, **policy)
    expected = answer_text(session)
    store = SnapshotStore(tmp_path / "saved")
    info = session.save_snapshot(store)
    header, homes = home_files(store.root / info.key)
    disk_homes = [h for layer in session.cache.layers for h in layer.homes if h.disk is not None]
    assert len(homes) == sum(len(h.planes) for h in disk_homes) > 0
    tier_inodes = {os.stat(f).st_ino for f in (tmp_path / "tier").glob("kv-*/*.kv")}
    for entry in homes:  # the tier's own files, not copies; the CRC covers the document's rows
        path = store.root / info.key / entry.name
        assert path.stat().st_ino in tier_inodes and path.stat().st_nlink == 2
        assert zlib.crc32(path.read_bytes()[: entry.num_bytes]) == entry.crc32
    written = sum(f.num_bytes for f in header.files if not f.is_home)
    assert written + sum(f.num_bytes for f in homes) == header.num_bytes and written < header.num_bytes / 2

    # The session goes on with questions (rows past the document change in the linked files) ...
    assert answer_text(session, "w7 w8") and answer_text(session) == expected
    # ... and the snapshot restores exactly, into RAM alone and into another disk-tier session.
    for restored_policy in ({**policy}, tier_policy(model, tokenizer, text, tmp_path / "other", **policy)):
        restored = open_session(model, tokenizer, text, **restored_policy)
        assert restored.restore_snapshot(store) is not None
        assert all(torch.equal(a, b) for a, b in zip(head_kv_bytes(session), head_kv_bytes(restored)))
        assert answer_text(restored) == expected
        restored.clear()


def test_a_new_document_moves_linked_homes_to_fresh_files(tiny, tmp_path):
    model, tokenizer = tiny
    first, second = words_text(12, words=150), words_text(13, words=150)
    session = tier_session(model, tokenizer, first, tmp_path)
    kv_first = head_kv_bytes(session)
    store = SnapshotStore(tmp_path / "saved")
    info = session.save_snapshot(store)
    _, homes = home_files(store.root / info.key)
    linked = {store.root / info.key / f.name: (store.root / info.key / f.name).stat().st_ino for f in homes}

    session.set_document(second)  # same cache, rows from 0 again
    session.prefill()
    assert all(path.stat().st_nlink == 1 for path in linked)  # the tier left them; the snapshot keeps them
    live = {os.stat(f).st_ino for f in (tmp_path / "tier").glob("kv-*/*.kv")}
    assert not live & set(linked.values())
    session.clear()  # closes the tier: the snapshot's files are trimmed to the document's rows
    sizes = {f.name: f.num_bytes for f in homes}
    assert all(path.stat().st_size == sizes[path.name] for path in linked)

    restored = open_session(model, tokenizer, first)
    assert restored.restore_snapshot(store) is not None
    assert all(torch.equal(a, b) for a, b in zip(kv_first, head_kv_bytes(restored)))


def test_another_filesystem_copies_the_homes_instead(tiny, tmp_path, monkeypatch):
    model, tokenizer = tiny
    text = words_text(14, words=150)
    session = tier_session(model, tokenizer, text, tmp_path)

    def cross_device(source, target):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(disk_module.os, "link", cross_device)
    store = SnapshotStore(tmp_path / "saved")
    info = session.save_snapshot(store)
    _, homes = home_files(store.root / info.key)
    assert homes and all((store.root / info.key / f.name).stat().st_nlink == 1 for f in homes)
    restored = open_session(model, tokenizer, text)
    assert restored.restore_snapshot(store) is not None
    assert all(torch.equal(a, b) for a, b in zip(head_kv_bytes(session), head_kv_bytes(restored)))


def test_a_damaged_linked_file_is_refused_and_the_document_is_read_again(tiny, tmp_path):
    model, tokenizer = tiny
    text = words_text(15, words=150)
    session = tier_session(model, tokenizer, text, tmp_path)
    store = SnapshotStore(tmp_path / "saved")
    info = session.save_snapshot(store)
    session.clear()
    _, homes = home_files(store.root / info.key)
    path = store.root / info.key / homes[0].name
    data = bytearray(path.read_bytes())
    data[3] ^= 0x40
    path.write_bytes(data)
    restored = open_session(model, tokenizer, text)
    assert restored.restore_snapshot(store) is None and not restored.is_prefilled
    assert store.find(restored.snapshot_identity()) is None  # a damaged snapshot is deleted


@torch.inference_mode()
def test_the_running_checksum_matches_the_bytes_through_appends_crops_and_gaps(tmp_path):
    disk = DiskMemory(tmp_path)
    plane = disk.empty((64, 1, 2, 1, 8), torch.float32)
    rows = lambda a, b: torch.randn(b - a, 1, 2, 1, 8)  # noqa: E731

    def crc_of(n: int) -> int:
        return zlib.crc32(plane[:n].contiguous().view(torch.uint8).numpy().tobytes())

    for start in range(0, 40, 8):  # appends in order
        plane[start : start + 8] = rows(start, start + 8)
        disk.note_written(plane[start : start + 8])
    assert 40 in disk._find(plane)[0].crcs and disk.prefix_crc(plane, 40) == crc_of(40)
    plane[16:20] = rows(16, 20)  # a crop back to 16 and a shorter append
    disk.note_written(plane[16:20])
    assert max(disk._find(plane)[0].crcs) == 20 and disk.prefix_crc(plane, 20) == crc_of(20)
    plane[30:34] = rows(30, 34)  # a write past a gap: the chain stays, the prefix is read where it lacks
    disk.note_written(plane[30:34])
    assert disk.prefix_crc(plane, 34) == crc_of(34) and disk.prefix_crc(plane, 7) == crc_of(7)
    disk.close()


def test_a_version_2_snapshot_still_restores(tiny, tmp_path):
    import dataclasses

    from engine.store.format import HEADER_FILE, SnapshotHeader

    model, tokenizer = tiny
    text = words_text(16)
    session = open_session(model, tokenizer, text)
    session.prefill()
    store = SnapshotStore(tmp_path / "saved")
    info = session.save_snapshot(store)
    header_path = store.root / info.key / HEADER_FILE
    old = dataclasses.replace(SnapshotHeader.from_json(header_path.read_text()), version=2)  # no home files: v2
    header_path.write_text(old.to_json())
    restored = open_session(model, tokenizer, text)
    assert restored.restore_snapshot(store) is not None
    assert all(torch.equal(a, b) for a, b in zip(head_kv_bytes(session), head_kv_bytes(restored)))
