"""benchmarks/cpu/prefill_parts.py: the table of a read's parts against llama.cpp's prefill."""

from __future__ import annotations

import json

from benchmarks.records import ResultStore
from benchmarks.cpu import prefill_parts


def test_table_gives_each_placement_its_parts_and_the_seconds_to_tie_llamacpp(tmp_path):
    runs = [{"side": "llama.cpp", "context": 2048, "placement": "1 core", "phase": "prefill", "prefill": 100.0}]
    llamacpp = tmp_path / "llamacpp.json"
    llamacpp.write_text(json.dumps({"runs": runs}))
    store = ResultStore(tmp_path / "p.json", {"machine": "m", "torch": "t", "load_avg": [0.5]})
    store.append("prefill", "1 core", context=2048, threads=1, wall_s=25.6, products=20.0, dequantize=1.0,
                 attention=3.0, rest=1.6)
    store.append("prefill", "2 cores", context=2048, threads=2, wall_s=12.8, products=10.0, dequantize=1.0,
                 attention=1.0, rest=0.8)
    store.append("prefill", "1 core", context=8192, threads=1, wall_s=163.84, products=100.0, dequantize=4.0,
                 attention=50.0, rest=9.84)
    prefill_parts.write_markdown(store.records, tmp_path / "p.json", llamacpp)
    text = (tmp_path / "p.md").read_text()
    assert "| 1 core | 2,048 | 80.0 | 25.60 | 20.00 | 1.00 | 3.00 | 1.60 | 20.48 | 5.12 |" in text
    assert "| 2 cores | 2,048 | 160.0 | 12.80 | 10.00 | 1.00 | 1.00 | 0.80 | - | - |" in text  # no llama.cpp cell
    # llama.cpp's table is at 2K: a longer read has no cell to tie
    assert "| 1 core | 8,192 | 50.0 | 163.84 | 100.00 | 4.00 | 50.00 | 9.84 | - | - |" in text
