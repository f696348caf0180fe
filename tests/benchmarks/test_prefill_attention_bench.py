"""The CPU prefill-attention benchmark (issue 29): both routes timed in turns on the same chunk, and compared."""

from __future__ import annotations

import json

import pytest

from benchmarks.cpu import prefill_attention
from engine.kv import kernels, native

pytestmark = pytest.mark.skipif(native.kernel() is None, reason="no C compiler here: no host kernel to compare")


def test_chunk_part_times_both_routes_on_one_chunk_and_compares_their_outputs(tmp_path, capsys):
    before = kernels.ROUTE_COUNTS.copy()
    prefill_attention.main(["--parts", "chunk", "--threads", "1", "--rounds", "1", "--contexts", "512,700",
                            "--out", str(tmp_path)])
    result = json.loads((tmp_path / "prefill-attention.json").read_text())
    assert [(r["part"], r["keys"], r["threads"]) for r in result["rows"]] == [("chunk", 512, 1), ("chunk", 700, 1)]
    for row in result["rows"]:
        assert row["sdpa"]["samples"] == row["native"]["samples"] == 3
        assert row["sdpa"]["ms"] > 0 and row["native"]["ms"] > 0
        assert row["max_relative_difference"] < 1e-5  # the same attention, fp32 sums in two orders
    # each route ran: the kernel's calls counted, SDPA's too
    assert kernels.ROUTE_COUNTS["cpu-native-prefill"] > before["cpu-native-prefill"]
    assert kernels.ROUTE_COUNTS["sdpa-cpu"] > before["sdpa-cpu"]
    assert "| chunk | 700 | 1 |" in capsys.readouterr().out


def test_the_sdpa_mode_sends_a_chunk_back_to_sdpa_and_restores_the_route():
    import torch

    block, query = torch.randn(100, 1, 2, 2, 16), torch.randn(1, 4, 40, 16)
    before = kernels.ROUTE_COUNTS.copy()
    with prefill_attention._route("sdpa"):
        kernels.attend_span(query, block, q_offset=60, scaling=0.25)
    assert kernels.ROUTE_COUNTS["cpu-native-prefill"] == before["cpu-native-prefill"]
    kernels.attend_span(query, block, q_offset=60, scaling=0.25)
    assert kernels.ROUTE_COUNTS["cpu-native-prefill"] == before["cpu-native-prefill"] + 1
