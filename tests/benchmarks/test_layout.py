"""benchmarks/harness/layout.py: a study run into ``docs/benchmarks`` puts its records in ``data/`` and its report at
the top, citing the records from there; run into any other folder (a test's, a GPU run's), beside each other."""

from __future__ import annotations

from benchmarks.harness.layout import cited, data_file, report_of
from benchmarks.records import ResultStore
from benchmarks.cpu import pool_bytes


def test_data_goes_to_data_where_the_folder_has_one(tmp_path):
    assert data_file(tmp_path, "x.json") == tmp_path / "x.json"
    (tmp_path / "data").mkdir()
    assert data_file(tmp_path, "x.json") == tmp_path / "data" / "x.json"
    assert report_of(tmp_path / "data" / "x.json") == tmp_path / "x.md"
    assert report_of(tmp_path / "runs" / "x.json") == tmp_path / "runs" / "x.md"
    assert cited(tmp_path / "data" / "x.json", tmp_path / "x.md") == "data/x.json"


def test_a_study_writes_its_report_above_its_records(tmp_path):
    records = tmp_path / "data" / "pool-bytes.json"
    store = ResultStore(records, {"machine": "m", "torch": "t", "load_avg": [0.5]})
    store.append("decode", "8192 KiB", context=2048, threshold_kib=8192, block_bytes=4 << 20, threads=2,
                 seconds_per_token=0.19)
    pool_bytes.write_markdown(store.records, records)
    assert records.is_file() and not (tmp_path / "data" / "pool-bytes.md").exists()
    assert "(raw records: `data/pool-bytes.json`)" in (tmp_path / "pool-bytes.md").read_text()


def test_the_defaults_write_under_data():
    from benchmarks.cpu import host_prefetch, overlap
    from benchmarks.weights import cpu_dtype, model_load

    for module in (host_prefetch, overlap, pool_bytes, cpu_dtype, model_load):
        assert module.OUT.parent.as_posix() == "docs/benchmarks/data", module.__name__
        assert report_of(module.OUT).parent.as_posix() == "docs/benchmarks"
