"""benchmarks/cpu/overlap.py: the table and its two predictions from raw records, and its C source builds."""

from __future__ import annotations

import platform
import subprocess

import pytest

from benchmarks.cpu import overlap
from benchmarks.records import ResultStore
from engine.native.library import compiler


def test_the_table_sets_each_stream_beside_the_overlapped_and_serial_predictions(tmp_path):
    store = ResultStore(tmp_path / "out.json", {"machine": "m", "torch": "t", "load_avg": [0.5]})
    plain, huge = "DRAM 4K pages, no prefetch", "DRAM huge pages, prefetch 8 KiB T2"
    store.append("stream", "k0", variant="L2", fmas_per_vector=0, bytes_per_s=200e9)
    store.append("stream", "k0", variant=plain, fmas_per_vector=0, bytes_per_s=40e9)
    store.append("stream", "k0", variant=huge, fmas_per_vector=0, bytes_per_s=30e9)
    store.append("stream", "k4", variant="L2", fmas_per_vector=4, bytes_per_s=60e9)
    store.append("stream", "k4", variant=plain, fmas_per_vector=4, bytes_per_s=20e9)
    store.append("stream", "k4", variant=huge, fmas_per_vector=4, bytes_per_s=24e9)
    overlap.write_markdown(store.records, tmp_path / "out.json")
    text = (tmp_path / "out.md").read_text()
    assert f"| K | L2 | overlapped | serial | {plain} | {huge} |" in text
    # overlapped: min(60, 40); serial: 1 / (1/60 + 1/40) = 24
    assert "| 4 | 60.0 | 40.0 | 24.0 | 20.0 | 24.0 |" in text  # the plain read: the fastest K = 0 stream, 40
    assert "| 0 | 200.0 | 40.0 | 33.3 | 40.0 | 30.0 |" in text


@pytest.mark.skipif(compiler() is None or platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 and a C compiler")
def test_the_c_stream_builds(tmp_path):
    built = subprocess.run([compiler(), "-O2", "-mavx512f", "-o", str(tmp_path / "overlap"), str(overlap.SOURCE)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
