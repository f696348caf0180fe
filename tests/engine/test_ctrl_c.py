"""Ctrl+C stops a read cleanly and keeps its checkpoint (issue 50, item 4). On Windows a console's Ctrl+C is
CTRL_C_EVENT, which Python raises as the same SIGINT handler's ``KeyboardInterrupt`` as on Linux; the console sends
it to every process attached, as a terminal sends SIGINT to its foreground process group.

In-process: Ctrl+C while serving (``interrupt.stop_on_ctrl_c``) stops a read on another thread at its next layer,
checkpoints what it read and waits for it. End to end: ``launch.py`` reads a document through the page's API, its
process group gets SIGINT once a checkpoint has landed, and the studio ends with status 0 and no traceback. Both
continue from the checkpoint in a fresh session to the K/V, logits and greedy answer of an uninterrupted read.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from checkpoint_reads import CHUNK, WORDS, assert_same_read, chunked_session, read_outcome
from tiny_sessions import words_text

from engine import PrefillCancelled, SnapshotStore, interrupt
from engine.errors import SnapshotError
from engine.store.format import HEADER_FILE, read_header
from engine.types import CheckpointPlan

ROOT = Path(__file__).resolve().parents[2]


def _as_a_fresh_process() -> None:
    interrupt._STOPPING.clear()  # Ctrl+C's stop holds for the rest of the process: a fresh one starts without it


@pytest.fixture(autouse=True)
def console_ctrl_c():
    """Ctrl+C as a console delivers it: a run started in the background of a shell inherits SIGINT ignored (which the
    studio keeps ignored, and passes to launch.py through exec); these tests are of the console's Ctrl+C."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def serving():
    yield
    _as_a_fresh_process()


def _reference(model, tokenizer, text: str):
    reference = chunked_session(model, tokenizer, text)
    reference.prefill()
    expected = read_outcome(reference)
    reference.clear()
    return expected


def test_ctrl_c_while_serving_stops_a_read_and_checkpoints_what_it_read(tiny_dir, tmp_path, serving):  # noqa: F811
    _, model, tokenizer = tiny_dir
    text = words_text(11, WORDS)
    expected = _reference(model, tokenizer, text)
    store = SnapshotStore(tmp_path / "kv")
    session = chunked_session(model, tokenizer, text)
    outcome = {}

    def read() -> None:  # as the app reads: on a thread of its own, checkpointing (here only when stopped)
        try:
            session.prefill(give_way=lambda: time.sleep(0.05), checkpoints=CheckpointPlan(store, every_chunks=1000))
        except PrefillCancelled as cancelled:
            outcome["cancelled"] = cancelled

    reader = threading.Thread(target=read)
    with pytest.raises(KeyboardInterrupt), interrupt.stop_on_ctrl_c(wait_seconds=60):
        reader.start()
        deadline = time.monotonic() + 120
        while session.prefilled_tokens < 3 * CHUNK:
            assert reader.is_alive() and time.monotonic() < deadline, "the read ended before Ctrl+C"
            time.sleep(0.01)
        signal.raise_signal(signal.SIGINT)  # the console's Ctrl+C, delivered to this (the main) thread
        time.sleep(60)  # never reached: the handler raises KeyboardInterrupt at once
    assert not reader.is_alive(), "leaving the block waits for the read to stop"
    assert "cancelled" in outcome and session.prefilled_tokens < session.document_tokens
    [info] = SnapshotStore(store.root).list()  # the checkpoint written at the stop, none before it
    assert info.is_partial and info.num_read == session.prefilled_tokens >= 3 * CHUNK
    _as_a_fresh_process()
    resumed = chunked_session(model, tokenizer, text)
    assert resumed.restore_snapshot(store).num_tokens == info.num_read
    resumed.prefill()
    assert_same_read(read_outcome(resumed), expected)


def test_without_ctrl_c_a_stopped_read_checkpoints_nothing_more(tiny_dir, tmp_path):  # noqa: F811
    _, model, tokenizer = tiny_dir
    store = SnapshotStore(tmp_path / "kv")
    session = chunked_session(model, tokenizer, words_text(11, WORDS))
    with pytest.raises(PrefillCancelled):  # a Cancel button's stop: the read stays in memory, continued from there
        session.prefill(lambda progress: None, lambda: session.prefilled_tokens >= 3 * CHUNK,
                        checkpoints=CheckpointPlan(store, every_chunks=1000))
    assert not interrupt.stopping() and store.list() == []


# -- end to end: launch.py in a process group of its own, Ctrl+C to the group -----------------------------------------
SENTENCES = 80  # ~770 tokens: 48 forwards of CHUNK, the app's first checkpoint after 16 (CHECKPOINT_EVERY_CHUNKS)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until(ready, studio: subprocess.Popen, log: Path, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while (found := ready()) is None:
        assert studio.poll() is None, f"the studio ended before {what}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {what} in {seconds:.0f} s:\n{log.read_text()}"
        time.sleep(0.05)
    return found


def _answers(url: str):
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return True if response.status == 200 else None
    except OSError:
        return None


def _checkpointed(store_dir: Path) -> int | None:
    for header in store_dir.glob(f"*/{HEADER_FILE}"):
        try:
            return read_header(header.parent).num_read
        except SnapshotError:  # being replaced: the next look reads the new one
            return None
    return None


@pytest.mark.slow
def test_ctrl_c_stops_the_studios_read_exits_cleanly_and_the_read_continues_from_its_checkpoint(tmp_path):
    from gradio_client import Client, handle_file

    from app.saved.saved_docs import SHELF_FILE, ShelfEntry
    from engine import load_model

    document = tmp_path / "numbers.txt"
    document.write_text(" ".join(f"word{i % 97} is number {i}." for i in range(SENTENCES)))
    store_dir, log, port = tmp_path / "kv", tmp_path / "launch.log", _free_port()
    with log.open("w") as sink:  # a session of its own: the group a console's Ctrl+C reaches, children included
        studio = subprocess.Popen([sys.executable, "launch.py", "--port", str(port), "--chunk-size", str(CHUNK),
                                   "--kv-cache-dir", str(store_dir)], cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}/"
        _wait_until(lambda: _answers(url), studio, log, 600, "page")  # (a cold cache converts the model first)
        client = Client(url, verbose=False)
        client.predict([handle_file(str(document))], api_name="/upload")
        reading = client.submit(False, api_name="/read")
        first = _wait_until(lambda: _checkpointed(store_dir), studio, log, 600, "checkpoint")
        assert not reading.done(), "the read ended before Ctrl+C"
        os.killpg(studio.pid, signal.SIGINT)
        status = studio.wait(timeout=300)
    finally:
        if studio.poll() is None:
            os.killpg(studio.pid, signal.SIGKILL)
            studio.wait()
    output = log.read_text()
    assert status == 0, output
    assert "Traceback" not in output and "terminate called" not in output, output
    assert "Keyboard interruption in main thread... closing server." in output  # Gradio's one line
    assert "Ctrl+C: stopping the reads and answers under way" in output and "nothing is left computing" in output
    [info] = SnapshotStore(store_dir).list()
    assert info.is_partial and first <= info.num_read < info.num_tokens, info
    assert f"checkpointed the read at {info.num_read} of {info.num_tokens} tokens" in output

    # A fresh process (this one) continues the read from the checkpoint, with the studio's model and the text it read.
    model, tokenizer = load_model()  # what launch.py serves by default (test_launch)
    text = ShelfEntry.from_json((info.path / SHELF_FILE).read_text()).text
    expected = _reference(model, tokenizer, text)
    resumed = chunked_session(model, tokenizer, text)  # (launch.py's policy: --chunk-size alone)
    assert resumed.restore_snapshot(SnapshotStore(store_dir)).num_tokens == info.num_read
    resumed.prefill()
    assert_same_read(read_outcome(resumed), expected)
