"""benchmarks/cpu/split_pool.py: the table from raw records (no model), and its "Python hand-off" variant splits
a GEMV as run_split does, into the rows the C pool would give whole."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.records import ResultStore
from benchmarks.cpu import split_pool
from engine.cpu import gguf_blocks


def test_the_table_gives_each_variant_per_context_and_the_best_c_ratio(tmp_path):
    store = ResultStore(tmp_path / "out.json", {"machine": "m", "torch": "t", "load_avg": [0.5]})
    for mode, seconds in ((split_pool.PYTHON, 0.200), ("C pool, spin 0 us", 0.170), ("C pool, spin 50 us", 0.160)):
        store.append("decode", mode, context=2048, threads=2, seconds_per_token=seconds)
    store.append("decode", "C pool, spin 0 us", context=8192, threads=2, seconds_per_token=0.18)  # no baseline
    store.append("prefill", "before: fresh weight, Python hand-off", context=512, threads=2, tokens_per_second=30.0,
                 ratio_to_before=1.0)
    store.append("prefill", "now: reused scratch, C pool", context=512, threads=2, tokens_per_second=37.5,
                 ratio_to_before=0.8)
    split_pool.write_markdown(store.records, tmp_path / "out.json")
    text = (tmp_path / "out.md").read_text()
    assert "| 512 | 2 | 30.0 | 37.5 | 0.800 |" in text
    assert "| python hand-off: ms | C pool, spin 0 us: ms | C pool, spin 50 us: ms | best C / Python |" in text
    assert "| 2,048 | 2 | 200.0 | 170.0 | 160.0 | 0.800 |" in text
    assert "| 8,192 |" not in text


@pytest.mark.skipif(gguf_blocks.kernel() is None, reason="no C compiler here")
def test_the_python_variant_gives_the_c_pools_result_through_the_host_pool(monkeypatch):
    functions = gguf_blocks.kernel()
    submitted = []
    workers = split_pool.shared_workers()

    class Counting:
        def submit(self, fn, *args):
            submitted.append(args[-2:])
            return workers.submit(fn, *args)

    monkeypatch.setattr(split_pool, "shared_workers", lambda: Counting())
    raw = gguf_blocks.random_block_rows(np.random.default_rng(0), 12, 1536, 512)
    x = torch.randn(1, 512)
    by_c, by_python = torch.empty(1, 1536), torch.empty(1, 1536)
    args = (x.data_ptr(), raw.data_ptr(), 12, None)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert functions.gemv_split(*args, by_c.data_ptr(), 1, 512, 1536, 2) == 0
        assert split_pool._python_split(functions)(*args, by_python.data_ptr(), 1, 512, 1536, 2) == 0
    finally:
        torch.set_num_threads(threads)
    assert submitted == [(768, 1536)]  # the first half on the caller, the second on the host pool, as before
    assert torch.equal(by_c, by_python)
