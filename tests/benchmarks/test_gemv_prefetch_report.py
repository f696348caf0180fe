"""benchmarks/cpu/gemv_prefetch.py: the tables from raw records (no build, no model), and the builds it
compares are the engine's own sources with the old hint forced."""

from __future__ import annotations

from benchmarks.records import ResultStore
from benchmarks.cpu import gemv_prefetch


def test_tables_give_each_build_and_the_ratio_to_before(tmp_path):
    store = ResultStore(tmp_path / "out.json", {"machine": "m", "torch": "t", "load_avg": [0.5]})
    what, _, rows, inputs = gemv_prefetch.SHAPES[0]
    store.append("gemv", "before", variant=what, seconds=1.0, weights_per_s=4e9)
    store.append("gemv", "now", variant=what, seconds=0.5, weights_per_s=10e9)
    store.append("decode", "before", context=2048, seconds_per_token=0.25)
    store.append("decode", "now", context=2048, seconds_per_token=0.2)
    gemv_prefetch.write_markdown(store.records, tmp_path / "out.json")
    text = (tmp_path / "out.md").read_text()
    assert f"| {what}, {rows:,} rows | {inputs:,} | 4.00 | 10.00 | 2.50 |" in text
    assert "| 2,048 tokens | 250 | 200 | 0.800 |" in text
    # a shape measured by one build only has no row
    assert gemv_prefetch.SHAPES[1][0] not in text


def test_before_is_the_same_source_with_the_non_temporal_hint():
    assert gemv_prefetch.BUILDS["now"] == []
    assert gemv_prefetch.BUILDS["before"] == ["-DPREFETCH_HINT=0"]
    for source in (gemv_prefetch.gguf_blocks._SOURCE, gemv_prefetch.int8_matmul._SOURCE):
        text = source.read_text()
        assert "#ifndef PREFETCH_HINT" in text and "#define PREFETCH_HINT 3" in text, source.name
        # every fp32 path's prefetch takes the hint; the VNNI path's have their own (~16 KB ahead, into L2)
        vnni = text.count(", VN_PREFETCH_HINT);")
        assert text.count(" PREFETCH_HINT);") + vnni == text.count("__builtin_prefetch("), source.name
