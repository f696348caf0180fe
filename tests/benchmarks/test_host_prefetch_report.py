"""benchmarks/harness/host_prefetch.py: the table from raw records (no build), and the build it compares with is the
engine's source with only the old hint forced (int8 homes: the same hint in both, the control)."""

from __future__ import annotations

from benchmarks.harness import host_prefetch
from benchmarks.records import ResultStore
from engine.kv import native


def test_table_gives_each_build_its_ratio_and_skips_half_measured_rows(tmp_path):
    store = ResultStore(tmp_path / "out.json", {"machine": "m", "torch": "t", "load_avg": [0.5]})
    store.append("layer", "before", context=32768, variant="bf16/1", seconds=0.020, gbps=6.0, read_gbps=10.0)
    store.append("layer", "now", context=32768, variant="bf16/1", seconds=0.018, gbps=7.0, read_gbps=10.0)
    store.append("layer", "before", context=131072, variant="int8/0", seconds=0.050, gbps=5.0, read_gbps=10.0)
    host_prefetch.write_markdown(store.records, tmp_path / "out.json")
    text = (tmp_path / "out.md").read_text()
    assert "| bf16 | 32,768 | 1 | 20.00 | 18.00 | 0.900 | 0.60 | 0.70 |" in text
    assert "| int8 | 131,072 |" not in text  # measured by one build only


def test_before_is_the_same_source_with_the_l1_hint_and_int8_keeps_it():
    assert host_prefetch.BUILDS == {"before": ["-DHA_PREFETCH_HINT=3"], "now": []}
    text = native._SOURCE.read_text()
    assert "#ifndef HA_PREFETCH_HINT\n#define HA_PREFETCH_HINT 1 " in text
    assert "#ifndef HA_PREFETCH_HINT_INT8\n#define HA_PREFETCH_HINT_INT8 3 " in text
    # every request goes through the one helper that picks the hint by dtype
    assert text.count("__builtin_prefetch(") == 2 and "prefetch_line_hinted(" in text
