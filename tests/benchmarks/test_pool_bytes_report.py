"""benchmarks/cpu/pool_bytes.py: the table from raw records (no model), and the threshold it measures is the one
the CPU decode route reads at each call."""

from __future__ import annotations

import torch

from benchmarks.records import ResultStore
from benchmarks.cpu import pool_bytes
from engine.kv import kernels


def test_the_table_gives_each_threshold_per_context_and_the_ratio(tmp_path):
    store = ResultStore(tmp_path / "out.json", {"machine": "m", "torch": "t", "load_avg": [0.5]})
    for kib, seconds in ((8192, 0.192), (3072, 0.184)):
        store.append("decode", f"{kib} KiB", context=2048, threshold_kib=kib, block_bytes=4 << 20, threads=2,
                     seconds_per_token=seconds)
    store.append("decode", "8192 KiB", context=1024, threshold_kib=8192, block_bytes=2 << 20, threads=2,
                 seconds_per_token=0.18)  # one threshold only: no row
    pool_bytes.write_markdown(store.records, tmp_path / "out.json")
    text = (tmp_path / "out.md").read_text()
    assert "| POOL_BYTES 8,192 KiB: ms | POOL_BYTES 3,072 KiB: ms |" in text
    assert "| 2,048 | 4.0 | 192.0 | 184.0 | 0.958 |" in text
    assert "| 1,024 |" not in text


def test_the_cpu_route_pools_a_block_from_the_threshold_it_reads_at_each_call(monkeypatch):
    calls = []
    monkeypatch.setattr(kernels.native, "attend_span", lambda *a, num_threads, **k: calls.append(num_threads))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(kernels, "usable_cores", lambda: 2)
    block = torch.empty(1 << 20, dtype=torch.float32)  # 4 MiB
    kernels._cpu_tile(None, block, 0, 1.0, None, None)
    monkeypatch.setattr(kernels, "POOL_BYTES", 8 << 20)
    kernels._cpu_tile(None, block, 0, 1.0, None, None)
    assert calls == [2, 1]  # the engine's 3 MiB pools a 2K-token layer of the CPU default model; 8 MiB did not
