"""benchmarks/cpu/cpu_matmul.py: the tables from raw records, and a real (tiny) run of the shape comparison that
measures both products and leaves the machine's choice in place."""

from __future__ import annotations

import pytest

from benchmarks.records import ResultStore
from benchmarks.cpu import cpu_matmul as bench
from engine.cpu import cpu_matmul


def test_the_tables_give_each_product_per_shape_and_prefill_and_the_ratio(tmp_path):
    store = ResultStore(tmp_path / "out.json", {"machine": "m", "torch": "t", "load_avg": [0.5]})
    for path, gflops in (("F.linear", 104.0), ("oneDNN", 239.2)):
        store.append("shape", path, shape="gate / up", rows=512, inputs=1536, outputs=8960, threads=1, gflops=gflops)
    store.append("shape", "oneDNN", shape="down", rows=512, inputs=8960, outputs=1536, threads=1, gflops=240.0)
    for path, rate in (("F.linear", 63.0), ("oneDNN", 112.2)):
        store.append("prefill", path, context=2048, chunk=512, threads=2, tokens_per_s=rate)
    bench.write_markdown(store.records, tmp_path / "out.json")
    text = (tmp_path / "out.md").read_text()
    assert "| 1 | gate / up | [512x1536] x [1536x8960] | 104.0 | 239.2 | 2.30 |" in text
    assert "| down |" not in text  # one product only: no row
    assert "| 2 | 2,048 tokens, qwen2.5-coder-1.5b | 63.0 | 112.2 | 1.78 |" in text


@pytest.mark.skipif(not cpu_matmul.available(), reason="this torch has no oneDNN linear")
def test_a_tiny_shape_run_measures_both_products_and_restores_the_machines_choice(tmp_path, monkeypatch):
    ran = []
    real = cpu_matmul._onednn
    monkeypatch.setattr(cpu_matmul, "_onednn", lambda *a: ran.append("oneDNN") or real(*a))
    store = ResultStore(tmp_path / "out.json", {"machine": "m"})
    bench.shapes(store, rows=16, threads=1, repeats=2, rounds=2, chosen=(("tiny", 64, 32),))
    assert sorted(r["mode"] for r in store.records) == ["F.linear", "oneDNN"]
    assert all(r["metrics"]["gflops"] > 0 and len(r["metrics"]["samples"]) == 4 for r in store.records)
    assert len(ran) == 2 * (1 + 2)  # two rounds of a first call and two timed calls
    assert cpu_matmul._forced == []
