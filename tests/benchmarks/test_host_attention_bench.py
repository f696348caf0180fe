"""The host attention benchmark (issue 12): the CPU table and the one-call GPU run's step, on tiny sizes."""

from __future__ import annotations

import json

from benchmarks import gpu_all, host_attention
from benchmarks.records import load_records


def test_cpu_table_puts_the_kernel_next_to_the_read_bandwidth(tmp_path, capsys):
    host_attention.main(["--tokens", "1K,2K", "--groups", "1", "--repeats", "1", "--read-mib", "16",
                         "--out", str(tmp_path)])
    result = json.loads((tmp_path / "host-attention-cpu.json").read_text())
    assert [row["tokens"] for row in result["rows"]] == [1024, 2048]
    assert result["read"]["read_gbps"] > 0 and all(row["gbps"] > 0 and row["x_read"] > 0 for row in result["rows"])
    assert result["run"]["machine"] and result["run"]["date"]
    assert "| KV heads per group | tokens |" in capsys.readouterr().out


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
