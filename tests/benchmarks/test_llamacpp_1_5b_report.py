"""benchmarks/weights/llamacpp_1_5b.py: medians, ratios and verdicts per placement from raw runs (no model, no
llama.cpp), and which runs an --add keeps."""

from __future__ import annotations

from benchmarks.weights import llamacpp_1_5b as bench


def _run(side, context, phase, placement, **figures):
    return {"side": side, "context": context, "phase": phase, "placement": placement, "load_avg": [2.0, 2.0, 2.0],
            "build": "abc", "type": "qwen2 1.5B Q4_K - Medium", "cpu": "x", **figures}


def _record():
    runs = [_run("ours", 2048, "decode", "1 core", decode=5.0, prefill=55.0),
            _run("llama.cpp", 2048, "decode", "1 core", decode=4.0),
            _run("llama.cpp", 2048, "prefill", "1 core", prefill=50.0),
            _run("stock", 2048, "decode", "1 core", decode=1.0, prefill=20.0),
            _run("ours", 8192, "decode", "1 core", decode=3.0),
            _run("llama.cpp", 8192, "decode", "1 core", decode=4.0),
            _run("ours", 30720, "decode", "2 cores", decode=2.0)]
    return {"runs": runs, "stamp": {}, "gguf_name": "m.gguf", "gguf_bytes": 1 << 30, "decode_tokens": 4}


def test_ratios_and_verdicts_per_placement(tmp_path):
    summary = bench.summarize(_record())
    assert summary["1 core"]["2048"]["ours"] == {"decode": 5.0, "prefill": 55.0}
    bench.write_markdown(_record(), tmp_path / "out.json")
    text = (tmp_path / "out.md").read_text()
    assert "| prefill | 2,048 | 50.00 | 55.00 (1.10x) | 20.00 (0.40x) | **met** |" in text
    assert "| decode | 2,048 | 4.00 | 5.00 (1.25x) | 1.00 (0.25x) | **met** |" in text
    assert "| decode | 8,192 | 4.00 | 3.00 (0.75x) | - | **not met** |" in text
    assert "## 2 cores" in text and "| decode | 30,720 | - | 2.00 | - | - |" in text  # no llama.cpp figure: no verdict


def test_the_plan_alternates_sides_and_prefills_only_read_contexts():
    class Args:
        contexts, sides = [2048, 30720], ["ours", "stock", "llama.cpp"]
        stock_contexts, llama_contexts = [2048], [2048, 30720]

    steps = [s for s in bench.plan(Args) if s[3] == "1 core"]
    assert steps == [("ours", 2048, "decode", "1 core"), ("stock", 2048, "decode", "1 core"),
                     ("llama.cpp", 2048, "decode", "1 core"), ("llama.cpp", 2048, "prefill", "1 core"),
                     ("ours", 30720, "decode", "1 core"), ("llama.cpp", 30720, "decode", "1 core")]
