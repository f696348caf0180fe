"""Huge uploads against a running app: refused quickly, with the numbers, without the memory to read them."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from gradio_client import Client, handle_file
from ports import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def _peak_rss(pid: int) -> int:
    """The process's peak resident set size (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``launch.py`` serving the embedded model as a user starts it: (url, process)."""
    folder = tmp_path_factory.mktemp("served")
    port = free_port()
    log = folder / "launch.log"
    with log.open("w") as sink:
        process = subprocess.Popen([sys.executable, "launch.py", "--port", str(port), "--no-kv-cache",
                                    "--max-upload", "210MB"], cwd=ROOT,
                                   stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 240
    while True:
        assert process.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(url, timeout=5):
                break
        except OSError:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(1)
    yield url, process
    process.terminate()
    process.wait(timeout=30)


def test_a_200_mb_text_is_refused_quickly_in_little_memory(served, tmp_path):
    url, process = served
    huge = tmp_path / "huge.txt"
    line = b"The keeper climbed the stairs and trimmed the wick, then wrote the weather in the log.\n"
    with huge.open("wb") as out:
        block = line * (1 << 14)
        while out.tell() < 200 * 10**6:
            out.write(block)
    client = Client(url, verbose=False)
    try:
        started = time.monotonic()
        table, plan, truncate, status = client.predict([handle_file(str(huge))], api_name="/upload")
        seconds = time.monotonic() - started
    finally:
        client.close()
    # The limit is the window less what the plan keeps for the answer and the conversation.
    assert re.search(r"far beyond the [\d,]+ tokens a document may take", status), status
    assert "reads at most 8,192 tokens" in status
    assert "MiB of text): about 50," in status  # ~200 MB / 4 characters per token
    peak = _peak_rss(process.pid)
    assert peak <= 4 * GIB, f"peak RSS {peak / GIB:.2f} GiB"
    assert seconds < 60, seconds  # before: past 15 GiB of RAM and no answer in 90 s
    print(f"refused a 200 MB text in {seconds:.1f} s; server peak RSS {peak / GIB:.2f} GiB")


def test_a_file_over_max_upload_is_refused_by_the_server(served, tmp_path):
    url, _ = served
    big = tmp_path / "big.txt"
    with big.open("wb") as out:
        out.truncate(215 * 10**6)  # sparse: over the 210MB --max-upload
    client = Client(url, verbose=False)
    try:
        with pytest.raises(Exception, match="(?i)too large|exceed|size"):
            client.predict([handle_file(str(big))], api_name="/upload")
    finally:
        client.close()
