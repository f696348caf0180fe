"""benchmarks/cpu/gemv_vnni.py: the tables from raw records (no build, no model), and the builds it compares
are the engine's own source with VNNI taken away and as this CPU builds it."""

from __future__ import annotations

from benchmarks.records import ResultStore
from benchmarks.cpu import gemv_vnni


def test_tables_give_each_build_per_thread_count_and_the_ratio(tmp_path):
    store = ResultStore(tmp_path / "out.json", {"machine": "m", "torch": "t", "load_avg": [0.5]})
    what, _, rows, inputs = gemv_vnni.SHAPES[0]
    store.append("gemv", "fp32", variant=what, threads=1, seconds=1.0, bytes_per_s=16e9)
    store.append("gemv", "vnni", variant=what, threads=1, seconds=0.5, bytes_per_s=24e9)
    store.append("gemv", "fp32", variant=what, threads=2, seconds=1.0, bytes_per_s=30e9)
    store.append("gemv", "vnni", variant=what, threads=2, seconds=0.5, bytes_per_s=33e9)
    store.append("decode", "fp32", context=2048, threads=1, seconds_per_token=0.060)
    store.append("decode", "vnni", context=2048, threads=1, seconds_per_token=0.051)
    store.append("gemv", "vnni", variant=gemv_vnni.SHAPES[1][0], threads=1, seconds=1.0, bytes_per_s=1e9)
    gemv_vnni.write_markdown(store.records, tmp_path / "out.json")
    text = (tmp_path / "out.md").read_text()
    assert f"| {what}, {rows:,} rows | {inputs:,} | 1 | 16.0 | 24.0 | 1.50 |" in text
    assert f"| {what}, {rows:,} rows | {inputs:,} | 2 | 30.0 | 33.0 | 1.10 |" in text
    assert "| 2,048 tokens | 1 | 60.0 | 51.0 | 0.850 |" in text
    assert gemv_vnni.SHAPES[1][0] not in text  # measured by one build only: no row


def test_the_builds_are_the_engine_source_without_and_with_vnni():
    assert gemv_vnni.BUILDS == {"fp32": (["-mno-avx512vnni"], 0), "vnni": ([], 1)}
    text = gemv_vnni.gguf_blocks._SOURCE.read_text()
    assert "defined(__AVX512VNNI__)" in text and "int gguf_gemv_vnni(void)" in text
