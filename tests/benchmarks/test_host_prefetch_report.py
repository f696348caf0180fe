"""benchmarks/cpu/host_prefetch.py: the table from raw records, and a small run of the levels in turns."""

from __future__ import annotations

import pytest

from benchmarks.cpu import host_prefetch
from benchmarks.records import ResultStore, load_records
from engine.kv import native


def test_table_gives_each_case_the_l1_to_l2_ratio_and_skips_half_measured_rows(tmp_path):
    store = ResultStore(tmp_path / "out.json", {"machine": "m", "torch": "t", "load_avg": [0.5]})
    store.append("layer", "l1", context=32768, variant="qwen2.5-1.5b/fp32/1", seconds=0.018, gbps=7.0,
                 read_gbps=10.0)
    store.append("layer", "l2", context=32768, variant="qwen2.5-1.5b/fp32/1", seconds=0.020, gbps=6.0,
                 read_gbps=10.0)
    store.append("layer", "l1", context=131072, variant="llama3-8b/int8/0", seconds=0.050, gbps=5.0, read_gbps=10.0)
    store.append("layer", "before", context=8192, variant="bf16/1", seconds=0.05, gbps=5.0, read_gbps=10.0)  # old
    host_prefetch.write_markdown(store.records, tmp_path / "out.json")
    text = (tmp_path / "out.md").read_text()
    assert "| qwen2.5-1.5b | fp32 | 32,768 | 1 | 20.000 | 18.000 | 0.900 | 0.60 | 0.70 |" in text  # l2, l1
    assert "| int8 | 131,072 |" not in text  # measured at one level only
    assert "8,192" not in text  # the builds' records of the old benchmark


def test_a_small_run_times_both_levels_of_every_case(tmp_path):
    if native.kernel() is None:
        pytest.skip("no C compiler here")
    out = tmp_path / "hp.json"
    host_prefetch.main(["--rounds", "2", "--threads", "1", "--tokens", "64", "--read-mib", "4", "--out", str(out)])
    records = load_records(out)
    measured = {(r["variant"], r["mode"]) for r in records if r.get("phase") == "layer"}
    cases = {f"{shape}/{dtype}/1" for shape, dtype, _ in host_prefetch.CASES}
    assert measured == {(case, level) for case in cases for level in host_prefetch.LEVELS}
    text = out.with_suffix(".md").read_text()
    assert all(f"| {shape} | {dtype} | 64 | 1 |" in text for shape, dtype, _ in host_prefetch.CASES)
