"""A long read survives a crash: checkpoints land while reading, a child killed mid-read leaves a partial
snapshot, and continuing it gives the K/V, logits and greedy answer of an uninterrupted read.

Tiny random models with a word-level tokenizer (tests/engine/helpers/tiny_sessions.py); the crash is a real ``SIGKILL``
of a child process (``checkpoint_child.py``) after a checkpoint landed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from archs import tiny_configs
from checkpoint_reads import CHUNK, WORDS, assert_same_read, chunked_session, read_outcome
from tiny_sessions import tier_policy, word_tokenizer, words_text
from transformers import AutoModelForCausalLM

from engine import PrefillCancelled, SnapshotStore
from engine.store.format import HEADER_FILE, PREVIOUS_HEADER_FILE, read_header
from engine.types import CheckpointPlan

CHILD = Path(__file__).parent / "helpers" / "checkpoint_child.py"


def _kill_mid_read(model_dir: Path, store_dir: Path, text: str, tmp_path: Path, policy: dict, at_least: int) -> int:
    """Runs the child read, SIGKILLs it once a checkpoint of >= ``at_least`` tokens landed; returns its tokens."""
    text_file = tmp_path / "document.txt"
    text_file.write_text(text)
    child = subprocess.Popen([sys.executable, str(CHILD), str(model_dir), str(store_dir), str(text_file),
                              json.dumps(policy)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and child.poll() is None:
            headers = list(store_dir.glob(f"*/{HEADER_FILE}"))
            if headers:
                num_read = read_header(headers[0].parent).num_read
                if num_read is not None and num_read >= at_least:
                    break
            time.sleep(0.05)
        assert child.poll() is None, f"the child ended before it was killed: {child.communicate()}"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    return num_read


@pytest.mark.parametrize("kind", ["host", "disk-tier", "int8"])
def test_a_read_killed_mid_way_continues_to_the_same_answer(tiny_dir, tmp_path, kind):
    folder, model, tokenizer = tiny_dir
    text = words_text(11, WORDS)
    policy = {"chunk_size": CHUNK}
    if kind == "int8":
        policy["kv_dtype"] = "int8"
    if kind == "disk-tier":
        policy = {**tier_policy(model, tokenizer, text, tmp_path), "chunk_size": CHUNK}
    reference = chunked_session(model, tokenizer, text, **{k: v for k, v in policy.items() if k != "chunk_size"})
    reference.prefill()
    expected = read_outcome(reference)
    reference.clear()

    store_dir = tmp_path / "kv"
    killed_at = _kill_mid_read(folder, store_dir, text, tmp_path, policy, at_least=3 * CHUNK)
    store = SnapshotStore(store_dir)
    [info] = store.list()
    assert info.is_partial and 3 * CHUNK <= info.num_read < info.num_tokens

    session = chunked_session(model, tokenizer, text, **{k: v for k, v in policy.items() if k != "chunk_size"})
    if kind == "disk-tier":
        assert session.cache.plan.disk_slots > 0
    stats = session.restore_snapshot(store)
    assert stats is not None and stats.num_tokens == session.prefilled_tokens >= killed_at
    assert not session.is_prefilled
    session.prefill(checkpoints=CheckpointPlan(store, every_chunks=2))
    session.save_snapshot(store)
    [info] = store.list()
    assert not info.is_partial and info.num_tokens == session.document_tokens  # the whole replaced the part
    assert_same_read(read_outcome(session), expected)


def _cancel_after(num_checkpoints: int, store: SnapshotStore):
    """A should_stop that stops the read once ``num_checkpoints`` checkpoints of it landed."""
    def should_stop() -> bool:
        headers = list(store.root.glob(f"*/{PREVIOUS_HEADER_FILE}"))
        return len(headers) == 1 and read_header(headers[0].parent).num_read >= num_checkpoints * CHUNK
    return should_stop


def _pause() -> None:
    time.sleep(0.1)  # a tiny model reads faster than its checkpoints land: give them the time a real read would


# (Gemma 4: sliding and global layers of their own KV heads and head_dim, format version 5; its shared-KV layers
# hold no parts)
@pytest.mark.parametrize("arch", ["mistral-window", "gemma3-window", "gemma4-head-dims", "gemma4-global-kv",
                                  "gemma4-shared-kv"])
def test_windowed_layers_continue_from_their_last_window(tmp_path, arch):
    torch.manual_seed(7)
    model = AutoModelForCausalLM.from_config(tiny_configs()[arch], attn_implementation="headinfer").eval()
    tokenizer, text = word_tokenizer(), words_text(5, WORDS)
    reference = chunked_session(model, tokenizer, text)
    reference.prefill()
    expected = read_outcome(reference)
    store = SnapshotStore(tmp_path / "kv")
    reading = chunked_session(model, tokenizer, text)
    with pytest.raises(PrefillCancelled):
        reading.prefill(should_stop=_cancel_after(3, store), checkpoints=CheckpointPlan(store, every_chunks=1),
                        give_way=_pause)
    reading.clear()
    [info] = store.list()
    assert read_header(info.path).version == (5 if arch.startswith("gemma4") else 4)  # per-layer K/V shapes
    session = chunked_session(model, tokenizer, text)
    assert session.restore_snapshot(store).num_tokens == info.num_read < session.document_tokens
    session.prefill()
    assert_same_read(read_outcome(session), expected)


def test_a_checkpoint_cut_short_falls_back_to_the_one_before(tiny_dir, tmp_path):
    _, model, tokenizer = tiny_dir
    text = words_text(12, WORDS)
    store = SnapshotStore(tmp_path / "kv")
    reading = chunked_session(model, tokenizer, text)
    with pytest.raises(PrefillCancelled):
        reading.prefill(should_stop=_cancel_after(4, store), checkpoints=CheckpointPlan(store, every_chunks=1),
                        give_way=_pause)
    reading.clear()
    [info] = store.list()
    newest, previous = read_header(info.path), read_header(info.path, PREVIOUS_HEADER_FILE)
    assert previous.num_read < newest.num_read
    cut = [f for f in newest.files if f.is_part and f.stop == newest.num_read][-1]
    with open(info.path / cut.name, "r+b") as file:  # what a kill during a write-back leaves
        file.truncate(cut.num_bytes // 2)

    session = chunked_session(model, tokenizer, text)
    assert session.restore_snapshot(store).num_tokens == previous.num_read == session.prefilled_tokens
    session.prefill(checkpoints=CheckpointPlan(store, every_chunks=1))
    reference = chunked_session(model, tokenizer, text)
    reference.prefill()
    assert_same_read(read_outcome(session), read_outcome(reference))


def test_a_flipped_byte_in_the_newest_checkpoint_is_detected(tiny_dir, tmp_path):
    _, model, tokenizer = tiny_dir
    text = words_text(13, WORDS)
    store = SnapshotStore(tmp_path / "kv")
    reading = chunked_session(model, tokenizer, text)
    with pytest.raises(PrefillCancelled):
        reading.prefill(should_stop=_cancel_after(3, store), checkpoints=CheckpointPlan(store, every_chunks=1),
                        give_way=_pause)
    [info] = store.list()
    newest, previous = read_header(info.path), read_header(info.path, PREVIOUS_HEADER_FILE)
    part = [f for f in newest.files if f.is_part and f.stop == newest.num_read][0]
    data = bytearray((info.path / part.name).read_bytes())
    data[len(data) // 2] ^= 0x40
    (info.path / part.name).write_bytes(data)
    session = chunked_session(model, tokenizer, text)
    assert session.restore_snapshot(store).num_tokens == previous.num_read


def test_the_size_limit_counts_partial_reads(tiny_dir, tmp_path):
    _, model, tokenizer = tiny_dir
    store = SnapshotStore(tmp_path / "kv")
    first = chunked_session(model, tokenizer, words_text(14, WORDS))
    with pytest.raises(PrefillCancelled):
        first.prefill(should_stop=_cancel_after(5, store), checkpoints=CheckpointPlan(store, every_chunks=1),
                      give_way=_pause)
    [partial] = store.list()
    assert partial.is_partial and store.total_bytes() == partial.num_bytes > 0
    # A cap that holds one read but not two: saving another document evicts the partial read.
    whole = chunked_session(model, tokenizer, words_text(15, WORDS))
    whole.prefill()
    cap = store.total_bytes() + whole.cache.kv_bytes()["host"] * 3 // 4
    capped = SnapshotStore(store.root, max_bytes=cap)
    time.sleep(0.01)
    info = whole.save_snapshot(capped)
    assert info is not None and [i.key for i in capped.list()] == [info.key]
    assert capped.total_bytes() <= cap
    # A read whose checkpoints would pass the cap stops checkpointing and goes on reading.
    tight = SnapshotStore(tmp_path / "tight", max_bytes=4096)
    third = chunked_session(model, tokenizer, words_text(16, WORDS))
    third.prefill(checkpoints=CheckpointPlan(tight, every_chunks=1))
    assert third.is_prefilled and tight.list() == []


def test_a_second_read_of_the_same_document_leaves_the_first_ones_checkpoints_alone(tiny_dir, tmp_path):
    """Two tabs reading one document checkpoint into one folder. The second used to delete the first's partial read
    as a stale one while the first went on adding parts to it; now the second reads on without checkpoints, and the
    first's continues to the answer of an uninterrupted read."""
    _, model, tokenizer = tiny_dir
    text = words_text(17, WORDS)
    store = SnapshotStore(tmp_path / "kv")
    first = chunked_session(model, tokenizer, text)
    second = chunked_session(model, tokenizer, text)
    ran = []

    def give_way() -> None:  # the second tab's whole read, run between two chunks of the first's
        _pause()
        if not ran and list(store.root.glob(f"*/{HEADER_FILE}")):
            ran.append(True)
            second.prefill(checkpoints=CheckpointPlan(store, every_chunks=1))

    with pytest.raises(PrefillCancelled):
        first.prefill(should_stop=_cancel_after(4, store), checkpoints=CheckpointPlan(store, every_chunks=1),
                      give_way=give_way)
    assert ran and second.is_prefilled
    first.clear()
    [info] = store.list()
    assert info.is_partial and info.num_read >= 4 * CHUNK
    session = chunked_session(model, tokenizer, text)
    assert session.restore_snapshot(store).num_tokens == info.num_read
    session.prefill(checkpoints=CheckpointPlan(store, every_chunks=1))  # the claim was let go: this one checkpoints
    assert_same_read(read_outcome(session), read_outcome(second))
