"""benchmarks/cpu/cpu_ceilings.py: a read's FLOPs, llama.cpp's prefill time from its table, the report from
raw records, and a small run."""

from __future__ import annotations

import json

import pytest

from benchmarks.cpu import cpu_ceilings
from benchmarks.weights import llamacpp_1_5b
from benchmarks.records import ResultStore, load_records
from engine.kv import native

TINY = {"hidden": 4, "intermediate": 8, "layers": 2, "heads": 2, "kv_heads": 1, "head_dim": 2}


def test_a_reads_flops_are_its_weight_products_and_its_causal_attention():
    # q, k, v, o, gate, up, down of hidden 4, KV width 2, intermediate 8: 16 + 8 + 8 + 16 + 32 + 32 + 32
    assert [k * n for _, k, n in cpu_ceilings.product_shapes(TINY, 1)] == [16, 8, 8, 16, 32, 32, 32]
    flops = cpu_ceilings.read_flops(TINY, tokens=3)
    assert flops["weights"] == 2 * 144 * 3 * 2
    # QK and PV: 2 products x 2 FLOPs x 2 heads x head dim 2 x (1 + 2 + 3) keys x 2 layers
    assert flops["attention"] == 2 * 2 * 2 * 2 * 6 * 2


def test_llamacpps_prefill_seconds_come_from_the_median_of_its_rounds(tmp_path):
    runs = [{"side": "llama.cpp", "context": 2048, "placement": "1 core", "phase": "prefill", "prefill": rate}
            for rate in (80.0, 100.0, 90.0)]
    runs.append({"side": "ours", "context": 2048, "placement": "1 core", "phase": "prefill", "prefill": 50.0})
    path = tmp_path / "llamacpp.json"
    path.write_text(json.dumps({"runs": runs}))
    assert llamacpp_1_5b.prefill_seconds(path) == pytest.approx(2048 / 90.0)
    assert llamacpp_1_5b.prefill_seconds(path, "2 cores") is None
    assert llamacpp_1_5b.prefill_seconds(tmp_path / "missing.json") is None


def test_report_says_how_near_the_read_the_arithmetic_alone_allows_and_what_the_products_leave(tmp_path):
    store = ResultStore(tmp_path / "c.json", {"machine": "m", "torch": "t", "load_avg": [0.5]})
    store.append("arithmetic", "fma", value=10e9)
    store.append("arithmetic", "gemm_l1_gflops", value=250.0)
    # 264 B in 11 ns at a 40 GB/s read: 0.6x at most; the budget at 0.7x is 264 / 28 = 9.43 ns
    store.append("attention", "llama3-8b int8", ns=11.0, bytes=264.0, read_gbps=40.0, budget_ns=264 / 28,
                 path="avx512")
    for _, k, n in cpu_ceilings.product_shapes(cpu_ceilings.QWEN, 1):
        store.append("products", cpu_ceilings._name(cpu_ceilings.CHUNK, k, n), gflops=200.0, onednn=True)
    cpu_ceilings.write_markdown(store.records, tmp_path / "c.json", llamacpp_s=25.0)
    text = (tmp_path / "c.md").read_text()
    assert "| 512-bit FMAs, 12 chains in registers | 10.00 G/s | 320 |" in text
    assert "| llama3-8b int8 | avx512 | 264 | 11.00 | 9.43 | 40.0 | 0.60 |" in text
    total = sum(cpu_ceilings.read_flops().values())
    assert f"| oneDNN, weighted over the layer's products | 200 | {total / 200e9:.1f} | {25e9 * 200 / total:.2f} |" \
        in text
    assert f"| the micro-kernel in L1 | 250 | {total / 250e9:.1f} |" in text


def test_a_small_run_records_the_arithmetic_and_every_attention_case(tmp_path):
    if native.kernel() is None:
        pytest.skip("no C compiler here")
    out = tmp_path / "c.json"
    cpu_ceilings.main(["--scale", "0.0001", "--repeats", "3", "--read-mib", "4", "--skip-products", "--out",
                       str(out)])
    records = load_records(out)
    assert {r["mode"] for r in records if r["phase"] == "arithmetic"} == {"fma", "dpbf16", "gemm_l1_gflops"}
    attention = {r["mode"]: r["metrics"] for r in records if r["phase"] == "attention"}
    assert set(attention) == {name for name, *_ in cpu_ceilings.ATTENTION}
    assert all(m["bytes"] > 0 and m["read_gbps"] > 0 for m in attention.values())
    assert "## Host attention with memory taken away" in out.with_suffix(".md").read_text()
