"""benchmarks/weights/gguf_weights.py: the table from raw runs (no model): medians, ratios to dense, and whether the
greedy tokens matched dense fp32's in every run."""

from __future__ import annotations

from benchmarks.weights import gguf_weights


def _run(round_index, source, mode, step_s, peak_mib, tokens):
    return {"round": round_index, "source": source, "mode": mode, "load_s": 1.0, "load_peak": 1,
            "peak": peak_mib << 20, "decode_s": [step_s] * 3, "tokens": tokens, "text": ""}


def test_table_ratios_and_token_agreement(tmp_path):
    runs = []
    for r in range(2):
        runs += [_run(r, "embedded", "dense", 0.2, 1000, [1, 2, 3]), _run(r, "embedded", "gguf", 0.1, 400, [1, 2, 3]),
                 _run(r, "qwen", "dense", 0.3, 2400, [5, 6]), _run(r, "qwen", "gguf", 0.1, 900, [5, 7] if r else [5, 6])]
    record = {"stamp": {"date": "2026-11-25T00:00", "machine": "m", "torch": "t", "load_avg": [0.5]},
              "context": 2048, "threads": 1, "runs": runs, "notes": ["- a note"]}
    gguf_weights.write_markdown(record, tmp_path / "out.json")
    text = (tmp_path / "out.md").read_text()
    assert "| embedded | dense | 200.0 | 1.00x | 1.0 | 1,000 | 1.00 | yes |" in text
    assert "| embedded | gguf | 100.0 | 2.00x | 1.0 | 400 | 0.40 | yes |" in text
    assert "| qwen | gguf | 100.0 | 3.00x | 1.0 | 900 | 0.38 | no |" in text  # one round answered otherwise
    assert text.rstrip().endswith("- a note")
