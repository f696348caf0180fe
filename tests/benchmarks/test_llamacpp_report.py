"""benchmarks/weights/llamacpp_compare.py: medians per side and mode, ratios and target verdicts from raw runs (no model,
no llama.cpp), and the peak RSS read from a child's own high-water mark."""

from __future__ import annotations

import sys

from benchmarks.weights import llamacpp_compare as compare


def _ours(round_index, context, mode, step_s, prefill_s, rss):
    return {"round": round_index, "context": context, "side": "ours", "what": mode, "decode_steps_s": [step_s] * 3,
            "prefill_s": prefill_s, "peak_rss": rss, "end_rss": rss // 2}


def _theirs(round_index, context, what, tokens_per_s, rss):
    return {"round": round_index, "context": context, "side": "theirs", "what": what, "tokens_per_s": tokens_per_s,
            "peak_rss": rss, "build": "abc", "cpu": "x", "type": "llama Q4_1"}


def _record():
    runs = [_ours(r, 2048, "int8", 0.05 * (r + 1), 2.0, 600 << 20) for r in range(3)]
    runs += [_theirs(r, 2048, "decode", 40.0, 200 << 20) for r in range(3)]
    runs += [_theirs(r, 2048, "prefill", 500.0, 250 << 20) for r in range(3)]
    runs += [_ours(0, 8192, "int8", 0.1, None, 700 << 20), _theirs(0, 8192, "decode", 8.0, 300 << 20)]
    return {"runs": runs, "stamp": {}, "gguf": "/x/model.gguf", "gguf_bytes": 1 << 20, "threads": 1,
            "decode_tokens": 3, "bare_rss": {"python": 10 << 20}}


def test_medians_ratios_and_verdicts(tmp_path):
    summary = compare.summarize(_record())
    assert summary["2048"]["int8"]["decode"] == 1 / 0.1  # the median round's step
    assert summary["2048"]["llama.cpp"] == {"decode": 40.0, "prefill": 500.0, "rss": 200 << 20}
    assert "prefill" not in summary["8192"]["int8"]  # a filled (not read) context has no prefill figure
    compare.write_markdown(_record(), tmp_path / "out.json")
    text = (tmp_path / "out.md").read_text()
    assert "| 2,048 | 40.0 | 10.0 (0.25x) | >= 0.8x |" in text
    assert "decode at 2,048: 0.25x llama.cpp (int8); target >= 0.8x: **not met**" in text
    assert "decode at 8,192: 1.25x llama.cpp (int8); target >= 1.0x: **met**" in text
    assert "prefill at 2,048: 2.05x llama.cpp (int8); target >= 1.0x: **met**" in text
    assert "rss at 2,048: 3.00x llama.cpp (int8); target <= 2.0x: **not met**" in text
    assert "Per round (ours / llama.cpp in the same round, the pairs that ran minutes apart): 2,048: int8 0.50 / " \
           "0.25 / 0.17; 8,192: int8 1.25." in text
    assert "2,048 tokens: int8 300 MiB; 8,192 tokens: int8 350 MiB." in text


def test_peak_rss_is_the_childs_own():
    # A child that allocates 200 MB reports at least that, and one that allocates nothing reports far less than this
    # test process (which imported torch): the parent's high-water mark does not leak into the child's.
    _, big = compare._run([sys.executable, "-c", "import time; b = bytearray(200 << 20); time.sleep(0.3)"])
    _, small = compare._run([sys.executable, "-c", "import time; time.sleep(0.3)"])
    assert big >= 200 << 20 and small < 100 << 20


def test_a_decode_target_whose_rounds_straddle_it_is_not_shown(tmp_path):
    record = _record()
    record["runs"] = [r for r in record["runs"] if r["context"] == 2048]
    record["runs"] += [_ours(0, 8192, "int8", 0.05, None, 1), _theirs(0, 8192, "decode", 10.0, 1),  # 2.0x
                       _ours(1, 8192, "int8", 0.2, None, 1), _theirs(1, 8192, "decode", 10.0, 1)]   # 0.5x
    compare.write_markdown(record, tmp_path / "out.json")
    assert "decode at 8,192: 1.25x llama.cpp (int8); target >= 1.0x: **not shown (rounds: 2.00x / 0.50x)**" in \
        (tmp_path / "out.md").read_text()


def test_the_floor_is_reported_beside_the_memory_target(tmp_path):
    record = _record()
    record["floor"] = {"stamp": {"date": "2026-11-25T20:00:00"}, "contexts": {"2048": 500 << 20}}
    compare.write_markdown(record, tmp_path / "out.json")
    text = (tmp_path / "out.md").read_text()
    assert "rss at 2,048: 3.00x llama.cpp (int8); target <= 2.0x: **not met** (the floor of an exact in-torch " \
           "engine: 2.50x)" in text
    assert "2,048 tokens 500 MiB (2.50x llama.cpp)." in text


def test_the_floor_child_holds_the_file_and_the_kv_it_is_given(tmp_path):
    """The floor process reads every page of the file and writes its K/V: its peak grows by both."""
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"\1" * (64 << 20))
    empty = tmp_path / "e.bin"
    empty.write_bytes(b"\1" * 4096)

    def peak(path, tokens):  # 4 layers x tokens x 2 x 8 heads x 256 floats = 64 KiB a token
        return compare._run([sys.executable, "-c", compare._FLOOR_CHILD, str(path), "LlamaForCausalLM", "4", "8",
                             "256", str(tokens)])[1]

    base = peak(empty, 1)
    assert peak(weights, 1) - base > 56 << 20
    assert peak(empty, 1024) - base > 56 << 20  # 64 MiB of float32 K/V
