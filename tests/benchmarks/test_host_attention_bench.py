"""The host attention benchmark (issues 12, 29): the CPU table and the one-call GPU run's step, on tiny sizes."""

from __future__ import annotations

import json

from benchmarks.cpu import host_attention
from benchmarks.gpu import gpu_all
from benchmarks.records import load_records


def test_cpu_table_puts_each_layer_call_next_to_the_read_on_the_same_threads(tmp_path, capsys):
    host_attention.main(["--tokens", "1K,2K", "--dtypes", "bf16,int8", "--threads", "1,all", "--repeats", "1",
                         "--read-mib", "16", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "host-attention-cpu.json").read_text())
    assert [(r["dtype"], r["tokens"], r["threads"]) for r in result["rows"]] == [
        (dtype, tokens, threads) for dtype in ("bf16", "int8") for tokens in (1024, 2048) for threads in (1, 0)]
    # A whole Llama-3-8B layer: 8 groups of one KV head at head dim 128; int8 homes carry a 4-byte scale per head
    bf16, int8 = result["rows"][0], result["rows"][4]
    assert bf16["home_bytes"] == 8 * 1024 * 2 * 128 * 2 and int8["home_bytes"] == 8 * 1024 * 2 * (128 + 4)
    assert all(r["gbps"] > 0 and r["read_gbps"] > 0 and r["x_read"] > 0 for r in result["rows"])
    # the best repeat next to the medians: on a shared machine the quietest repeat is the nearest to a quiet one
    assert all(r["x_read_cpu_best"] > 0 and r["best_ms"] <= r["seconds"] * 1e3 for r in result["rows"])
    assert set(result["fixed_cost"]) == {"c_call_1_thread", "c_call_every_core", "host_attention_attend"}
    assert result["run"]["machine"] and result["run"]["date"] and result["run"]["path"]
    assert "| home | tokens | threads |" in capsys.readouterr().out


def test_paths_are_timed_in_turns_a_row_each_on_the_path_asked_for(tmp_path, monkeypatch):
    """``--paths``: each layer call on every path asked for, a row per path naming the path that ran; the
    environment's forced path is back as it was afterwards."""
    from engine.kv import native

    function = native.kernel()
    paths = [name for name in ("portable", "avx512", "avx512bf16") if function.variant(native.PATHS[name])]
    monkeypatch.setenv(native.ENV_PATH, "portable")
    host_attention.main(["--tokens", "1K", "--dtypes", "bf16", "--threads", "1", "--repeats", "1",
                         "--read-mib", "16", "--paths", ",".join(paths), "--out", str(tmp_path)])
    result = json.loads((tmp_path / "host-attention-cpu.json").read_text())
    assert [r["path"] for r in result["rows"]] == paths
    assert native.forced_path() == "portable"
    assert all(f"| bf16 | 1K | 1 | {path} |" in (tmp_path / "host-attention-cpu.md").read_text() for path in paths)


def test_gpu_run_step_records_host_figures_and_three_decode_splits_on_cpu(tmp_path, monkeypatch):
    # One length and one step keep the smoke run short; the GPU run measures 32K, 128K and 512K.
    short = [a for a in host_attention.GPU_DECODE_ARGS]
    short[short.index("--decode-lengths") + 1], short[short.index("--decode-steps") + 1] = "32K", "1"
    short[short.index("--repeats") + 1] = "1"
    monkeypatch.setattr(host_attention, "GPU_DECODE_ARGS", short)
    gpu_all.main(["--device", "cpu", "--model", "tiny", "--out", str(tmp_path), "--scale", "0.0005",
                  "--steps", "host-attention", "--deadline-s", "120"])
    records = load_records(tmp_path / "gpu.json")
    host = {r["mode"] for r in records if r["phase"] == "host-attention" and r["status"] == "ok"}
    assert host == {"read", "kernel"}
    decoded = {r["mode"] for r in records if r["phase"] == "decode" and r["status"] == "ok"}
    assert decoded == {"headinfer-g1", "headinfer-g1-split", "headinfer-g1-host"}
    on_host = [r["metrics"] for r in records if r["phase"] == "decode" and r["mode"] == "headinfer-g1-host"]
    assert all(m["host_attention_s_per_token"] > 0 and m["host_share"] == 1.0 for m in on_host)
