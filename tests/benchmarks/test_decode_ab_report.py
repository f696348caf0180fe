"""benchmarks/cpu/decode_ab.py: the table from raw records (no model), and the modes each experiment sets."""

from __future__ import annotations

import pytest

from benchmarks.records import ResultStore
from benchmarks.cpu import decode_ab
from engine.cache import HeadInferLayer
from engine.kv import kernels
from engine.kv import native as host_kernel
from engine.cpu import gguf_blocks


def test_the_table_gives_each_mode_per_context_and_thread_count_and_the_ratio(tmp_path):
    store = ResultStore(tmp_path / "out.json", {"machine": "m", "torch": "t", "load_avg": [0.5]})
    store.append("decode", "generic", context=2048, threads=2, seconds_per_token=0.040)
    store.append("decode", "in-place", context=2048, threads=2, seconds_per_token=0.037)
    store.append("decode", "generic", context=2048, threads=1, seconds_per_token=0.054)
    store.append("decode", "generic", context=8192, threads=2, seconds_per_token=0.050)  # one mode only: no row
    decode_ab.write_markdown(decode_ab.EXPERIMENTS["in-place"], store.records, tmp_path / "out.json")
    text = (tmp_path / "out.md").read_text()
    assert "| context | threads | generic ms | in-place ms | in-place / generic |" in text
    assert "| 2,048 | 2 | 40.0 | 37.0 | 0.925 |" in text
    assert "| 2,048 | 1 |" not in text and "| 8,192 |" not in text
    assert "--experiment in-place" in text


def test_each_experiments_modes_set_the_path_they_name_and_put_it_back():
    if gguf_blocks.kernel() is None:
        pytest.skip("no C compiler here")
    runner = gguf_blocks.kernel().split_run
    shared = decode_ab.EXPERIMENTS["shared-pool"]
    with shared.mode("own"):
        assert host_kernel._shared_pool is None
    with shared.mode("shared"):
        assert host_kernel._shared_pool == runner
    assert host_kernel._shared_pool == runner
    in_place, decode_row = decode_ab.EXPERIMENTS["in-place"], HeadInferLayer.decode_row
    with in_place.mode("generic"):
        assert HeadInferLayer.decode_row is not decode_row and HeadInferLayer.decode_row(None) is None
    with in_place.mode("in-place"):
        assert HeadInferLayer.decode_row is decode_row
    assert HeadInferLayer.decode_row is decode_row
    pool_bytes, value = decode_ab.EXPERIMENTS["pool-bytes"], kernels.POOL_BYTES
    for mode, expected in zip(pool_bytes.modes, (3 << 20, 1 << 20)):
        with pool_bytes.mode(mode):
            assert kernels.POOL_BYTES == expected
    assert kernels.POOL_BYTES == value
