"""benchmarks/cpu/host_builds.py: builds parsed from the command line, the table from raw records, and a small
run of two builds in turns."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.cpu import host_builds
from benchmarks.records import ResultStore, load_records
from engine.kv import native


def test_a_build_is_a_name_and_its_flags_and_a_nameless_one_is_refused():
    assert host_builds.parse_build("before=-DHA_ROWS6=0 -DCH=32") == ("before", ["-DHA_ROWS6=0", "-DCH=32"])
    assert host_builds.parse_build("now=") == ("now", [])
    with pytest.raises(argparse.ArgumentTypeError):
        host_builds.parse_build("=-DX")


def test_table_gives_each_case_every_builds_ratio_to_the_first_and_skips_half_measured_rows(tmp_path):
    store = ResultStore(tmp_path / "out.json", {"machine": "m", "torch": "t", "load_avg": [0.5]})
    for name, seconds, gbps in (("before", 0.004, 6.0), ("now", 0.003, 8.0)):
        store.append("layer", name, context=32768, variant="qwen2.5-1.5b/fp32/1", seconds=seconds, gbps=gbps,
                     read_gbps=10.0)
    store.append("layer", "before", context=8192, variant="qwen2.5-1.5b/int8/0", seconds=0.002, gbps=5.0,
                 read_gbps=10.0)
    builds = {"before": ["-DHA_ROWS6=0"], "now": []}
    host_builds.write_markdown(store.records, builds, tmp_path / "out.json")
    text = (tmp_path / "out.md").read_text()
    assert "| qwen2.5-1.5b | fp32 | 32,768 | 1 | 4.000 | 3.000 | 0.750 | 0.60 | 0.80 |" in text
    assert "8,192" not in text  # measured by one build only
    assert "`-DHA_ROWS6=0`" in text and "(the source as it is)" in text


def test_a_small_run_times_every_build_in_every_case(tmp_path):
    if native.kernel() is None:
        pytest.skip("no C compiler here")
    out = tmp_path / "hb.json"
    host_builds.main(["--build", "a=-DHA_ROWS6=0", "--build", "b=", "--dtypes", "fp32,int8", "--tokens", "64",
                      "--threads", "1", "--rounds", "2", "--read-mib", "4", "--out", str(out)])
    measured = {(r["variant"], r["mode"]) for r in load_records(out) if r.get("phase") == "layer"}
    assert measured == {(f"qwen2.5-1.5b/{dtype}/1", name) for dtype in ("fp32", "int8") for name in "ab"}
    text = out.with_suffix(".md").read_text()
    assert "| qwen2.5-1.5b | fp32 | 64 | 1 |" in text and "| qwen2.5-1.5b | int8 | 64 | 1 |" in text
