"""The NIAH report on 8-bit KV: every cell against the exact grid, and the line kv8.md takes from it."""

from __future__ import annotations

import json

from benchmarks.quality.kv8_quality import niah_lines
from benchmarks.quality.niah import report_8bit


def _cell(target, depth, *, found, top, page=1, identical=True, answer="a"):
    return {"length": target + 100, "target": target, "depth": depth, "needle_page": page, "answer": answer,
            "found": found, "identical": identical, "top_source": top, "sources": [(top, 0.9)],
            "sources_s": 0.01, "sources_cost": 0.01}


EXACT = [_cell(1024, 0.0, found=True, top=1), _cell(1024, 0.5, found=False, top=4, page=3),
         _cell(2048, 0.0, found=True, top=1)]


def test_report_compares_each_cell_with_the_exact_grid_and_says_it_is_lossy():
    cells = [_cell(1024, 0.0, found=True, top=1),  # same outcome
             _cell(1024, 0.5, found=False, top=3, page=3, identical=False, answer="b"),  # top source moved
             _cell(4096, 0.0, found=True, top=1)]  # not in the exact grid
    text = report_8bit(cells, {14: [3]}, EXACT, "int8")
    assert "int8 KV (LOSSY 8-bit)" in text and 'kv_dtype="int8"' in text
    assert "same outcome as exact KV: 1/2 (found: 2/2, top source: 1/2)" in text
    assert "answers containing the needle: 2/3 on int8 vs 1/2 on exact KV" in text
    assert "greedy tokens identical to stock (exact KV): 2/3" in text
    rows = [line for line in text.splitlines() if line.startswith("| 1") or line.startswith("| 4")]
    assert rows[1].split(" | ")[4:8] == ["✓", "✗", "3", "✗"]  # found = exact, identical, top source, = exact
    assert rows[2].split(" | ")[4] == "—"


def test_kv8_report_takes_one_line_per_8bit_niah_run(tmp_path):
    assert niah_lines(tmp_path) == []
    (tmp_path / "niah.json").write_text(json.dumps({"cells": EXACT}))
    assert niah_lines(tmp_path) == []
    cells = [dict(c) for c in EXACT]
    cells[2].update(found=False, top_source=7)
    (tmp_path / "niah-int8.json").write_text(json.dumps({"cells": cells}))
    [line] = niah_lines(tmp_path)
    assert line.startswith("- int8 (`niah-int8.md`): same outcome (found, top source) as exact KV in 2/3 cells")
    assert "needle found 1/3 vs 2/3 exact; top source = the needle's page 1/1" in line
