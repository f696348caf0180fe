"""benchmarks/weights/gguf_first_load.py: the table from raw records (no model): medians of the latest run per
source and path, the file's size beside them, and the notes the code's comments point at."""

from __future__ import annotations

from benchmarks.weights import gguf_first_load


def _record(run_id, source, path, seconds, peak, disk):
    metrics = {"source": source, "path": path, "seconds": seconds, "load_peak_mib": peak, "anon_peak_mib": 400,
               "disk_peak_mb": disk, "kept_mb": 100, "gguf_mb": 98, "layers": 211}
    return {"phase": "gguf-first-load", "mode": f"{source}-{path}", "status": "ok", "metrics": metrics,
            "run": {"run_id": run_id, "machine": "m", "torch": "t", "transformers": "x", "load_avg": [0.5]}}


def test_the_latest_runs_medians_per_source_and_path(tmp_path):
    records = [_record("old", "embedded", "direct", 99.0, 9999, 9999)]  # an earlier run: replaced, not mixed in
    for seconds in (10.0, 30.0, 20.0):
        records += [_record("new", "embedded", "fp32-folder", seconds * 4, 1100, 640),
                    _record("new", "embedded", "direct", seconds, 550, 104)]
    gguf_first_load.write_markdown(records, tmp_path / "data" / "gguf-first-load.json")
    text = (tmp_path / "gguf-first-load.md").read_text()
    assert "| `embedded` | 98 | fp32-folder | 1,100 | 400 | 640 | 100 | 80.0 | 211 | 3 |" in text
    assert "| `embedded` | 98 | direct | 550 | 400 | 104 | 100 | 20.0 | 211 | 3 |" in text
    assert "## Notes from the code" in text and "16.5 GB of blocks" in text
