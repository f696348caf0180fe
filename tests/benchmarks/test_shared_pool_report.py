"""benchmarks/weights/shared_pool.py: the table from raw records (no model), and the two modes it compares."""

from __future__ import annotations

from benchmarks.records import ResultStore
from benchmarks.weights import shared_pool


def test_the_table_gives_each_mode_per_context_and_thread_count_and_the_ratio(tmp_path):
    store = ResultStore(tmp_path / "out.json", {"machine": "m", "torch": "t", "load_avg": [0.5]})
    store.append("decode", "own", context=2048, threads=2, seconds_per_token=0.040)
    store.append("decode", "shared", context=2048, threads=2, seconds_per_token=0.037)
    store.append("decode", "own", context=2048, threads=1, seconds_per_token=0.054)
    store.append("decode", "own", context=8192, threads=2, seconds_per_token=0.050)  # one mode only: no row
    shared_pool.write_markdown(store.records, tmp_path / "out.json")
    text = (tmp_path / "out.md").read_text()
    assert "| 2,048 | 2 | 40.0 | 37.0 | 0.925 |" in text
    assert "| 2,048 | 1 |" not in text and "| 8,192 |" not in text


def test_the_modes_are_the_kernels_own_pool_and_the_gemv_librarys():
    assert shared_pool.MODES == ("own", "shared")
    source = shared_pool.__loader__.get_source(shared_pool.__name__)
    assert "share_pool(runner if mode == \"shared\" else None)" in source
