"""Host attention (issue 12): the kernel against float64, parity on every architecture with every offloaded group
on the host and with a split, and the policy, planner, rates and worker-pool pieces around it. CPU only."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import torch
from archs import build_pair, tiny_configs
from parity import rel_diff
from probe_records import died_of_abort
from transformers import DynamicCache

import engine
from engine.kv import HostAttention, native
from engine.native.workers import TorchWorkers
from engine.planning import machine_rates
from engine.planning.host_split import HOST_LAYER_SECONDS, MIN_GAIN, choose_host_slots, forecast_decode, host_share
from engine.planning.planner import make_plan
from engine.planning.shape import ModelShape

PROMPT_LEN = 45  # longer than the sliding windows (8)
CHUNK = 16  # prefill chunks of 16 are host steps too: the kernel's causal and window masks run
RTOL = 1e-5


@pytest.fixture(scope="module", params=["native", "torch"])
def kernel(request):
    """The C tile and the torch tile. Tiles of 2 KiB: a 100-token home is cut into many, so the merge merges."""
    if request.param == "native" and native.kernel() is None:
        pytest.skip("no C compiler here: the torch tile is the one in use")
    return HostAttention(TorchWorkers(2), tile_bytes=2048, use_native=request.param == "native")


def reference(query, kvs, start, stop, scaling, window, softcap):
    """Whole-matrix softmax attention in float64; query [B, H, Q, D] at the last Q positions of [start, stop)."""
    q_len = query.shape[2]
    keys = torch.cat([kv[start:stop, :, 0] for kv in kvs], dim=2).permute(1, 2, 0, 3).double()  # [B, Hk, S, D]
    values = torch.cat([kv[start:stop, :, 1] for kv in kvs], dim=2).permute(1, 2, 0, 3).double()
    n_rep = query.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(n_rep, 1), values.repeat_interleave(n_rep, 1)
    scores = query.double() @ keys.transpose(2, 3) * scaling
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    q_pos, k_pos = torch.arange(stop - q_len, stop)[:, None], torch.arange(start, stop)[None]
    visible = k_pos <= q_pos
    if window:
        visible &= k_pos > q_pos - window
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ values


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-5), (torch.float16, 1e-5)],
                         ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("window, softcap", [(None, None), (7, None), (None, 2.0), (9, 3.0)],
                         ids=["full", "window", "softcap", "window-softcap"])
@pytest.mark.parametrize("q_len", [1, 5])
@pytest.mark.parametrize("batch, group, num_groups, n_rep", [(1, 1, 2, 2), (2, 2, 1, 3), (1, 4, 1, 1)],
                         ids=["gqa-2-groups", "batch-2", "mha"])
def test_kernel_matches_float64(kernel, dtype, tol, window, softcap, q_len, batch, group, num_groups, n_rep):
    torch.manual_seed(0)
    stop, dim = 100, 16
    kvs = [torch.randn(128, batch, 2, group, dim).to(dtype) for _ in range(num_groups)]
    query = torch.randn(batch, num_groups * group * n_rep, q_len, dim).to(dtype)
    # From the first visible key, and from 0 (the kernel then masks what the window hides).
    for start in {0, engine.kv.visible_start(stop - q_len, window)}:
        out = kernel.attend(query, kvs, start, stop, scaling=0.25, window=window, softcap=softcap)
        expected = reference(query, kvs, start, stop, 0.25, window, softcap)
        assert out.dtype == dtype and out.shape == query.shape
        # The kernel reads the stored values exactly and accumulates in fp32: what remains is fp32 rounding
        # and, for bf16/fp16, rounding the output itself to the query's dtype (at most one unit in its last place).
        scale = expected.abs().max()
        error = (out.double() - expected).abs().max()
        assert error <= (torch.finfo(dtype).eps + tol) * scale, (float(error / scale), dtype)


def test_a_failing_tile_is_raised_after_every_worker_stopped(kernel):
    kvs = [torch.randn(64, 1, 2, 1, 8)]

    def ready():
        raise RuntimeError("copy failed")

    job = kernel.start(torch.randn(1, 1, 1, 8), kvs, 0, 64, scaling=1.0, ready=ready)
    job.wait()
    with pytest.raises(RuntimeError, match="copy failed"):
        job.result()


def test_a_layers_groups_go_to_the_c_kernel_in_one_call(monkeypatch):
    if native.kernel() is None:
        pytest.skip("no C compiler here")
    calls = []
    attend_layer = native.attend_layer
    monkeypatch.setattr(native, "attend_layer", lambda *a, **k: calls.append(len(a[1])) or attend_layer(*a, **k))
    kvs = [torch.randn(300, 1, 2, 1, 64).to(torch.bfloat16) for _ in range(8)]
    query = torch.randn(1, 32, 1, 64).to(torch.bfloat16)
    out = HostAttention().attend(query, kvs, 0, 300, scaling=0.125)
    assert calls == [8]  # every group of the layer, one call
    expected = reference(query, kvs, 0, 300, 0.125, None, None)
    assert float((out.double() - expected).abs().max() / expected.abs().max()) <= torch.finfo(torch.bfloat16).eps


def test_a_layers_call_struct_is_built_once_and_never_reused_for_other_homes():
    """native.attend_layer keeps the ctypes struct of a layer's homes (a decode step calls each layer with the same
    homes): the same homes get the same struct back, other homes of the same shapes their own, each result exact."""
    if native.kernel() is None:
        pytest.skip("no C compiler here")
    torch.manual_seed(0)
    layers = [[torch.randn(40, 1, 2, 1, 32).to(torch.bfloat16) for _ in range(2)] for _ in range(2)]
    query, out = torch.randn(1, 8, 1, 32).to(torch.bfloat16), torch.empty(1, 8, 1, 32, dtype=torch.bfloat16)
    for kvs in [*layers, *layers]:
        native.attend_layer(query, kvs, 0, 40, out, scaling=0.2)
        expected = reference(query, kvs, 0, 40, 0.2, None, None)
        assert float((out.double() - expected).abs().max() / expected.abs().max()) <= torch.finfo(torch.bfloat16).eps
    first, second = (native._prepared(query, kvs, None, out) for kvs in layers)
    assert first is native._prepared(query, layers[0], None, out) and first is not second


def _available_paths() -> list[str]:
    function = native.kernel()
    if function is None:
        return []
    return [name for name in ("portable", "avx2", "avx512", "avx512bf16") if function.variant(native.PATHS[name])]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("n_rep, q_len", [(4, 3), (6, 1), (7, 1)], ids=["12-rows", "6-rows", "7-rows"])
def test_every_vector_path_forced_by_the_environment_computes_the_same(monkeypatch, dtype, n_rep, q_len):
    """Rows per head of 12 (blocks of 4), 6 (4 + 2: Qwen2.5-1.5B's decode) and 7 (4 + 2 + 1: Qwen2.5-0.5B's): every
    path against float64 and against the portable one."""
    paths = _available_paths()
    if len(paths) < 2:
        pytest.skip("one vector path here")
    assert "portable" in paths  # always built: the path of a CPU without AVX2
    torch.manual_seed(0)
    kvs = [torch.randn(700, 1, 2, 2, 128).to(dtype) for _ in range(3)]
    query = torch.randn(1, 3 * 2 * n_rep, q_len, 128).to(dtype)
    expected = reference(query, kvs, 0, 700, 0.1, 300, None)
    outs = {}
    for path in paths:
        monkeypatch.setenv(native.ENV_PATH, path)
        assert native.kernel().variant(native.PATHS[native.forced_path()]) == native.PATHS[path]
        outs[path] = HostAttention(tile_bytes=64 << 10).attend(query, kvs, 0, 700, scaling=0.1, window=300)
    for path, out in outs.items():  # each within its dtype's rounding of float64, and of the portable path
        scale = expected.abs().max()
        assert (out.double() - expected).abs().max() <= (torch.finfo(dtype).eps + 1e-6) * scale, path
        # the paths sum the same products in different lane orders: fp32 rounding (1e-5 relative, the parity
        # tolerance), and at most a unit in the last place of bf16/fp16 outputs rounded on either side of a tie
        tolerance = 1e-5 if dtype == torch.float32 else torch.finfo(dtype).eps
        assert (out.double() - outs["portable"].double()).abs().max() <= tolerance * scale, path


@pytest.mark.parametrize("kv_dtype", ["bf16", "int8"])
@pytest.mark.parametrize("dim", [16, 32, 128])  # AVX-512 reads bf16 in paired order from 32 on, AVX2 from 16
def test_every_path_is_exact_for_one_key_and_lengths_off_the_chunk_and_tile_grid(monkeypatch, kv_dtype, dim):
    """1 key, and lengths around the 4-key score steps, the 16-key vectors and the 64-key chunks, in tiles of 16
    keys with remainders: every vector path against float64 over the stored values (int8: over the dequantized
    codes, what dequantize-then-attend reads)."""
    from engine.kv import quant

    paths = _available_paths()
    if not paths:
        pytest.skip("no C compiler here")
    torch.manual_seed(0)
    homes = [torch.randn(200, 1, 2, 1, dim) for _ in range(2)]  # [T, B, 2, g, D]
    if kv_dtype == "int8":
        coded = [quant.quantize(home, "int8") for home in homes]
        kvs, scales = [c for c, _ in coded], [s for _, s in coded]
        exact = [quant.dequantize(codes, plane, torch.empty(codes.shape)) for codes, plane in coded]
    else:
        kvs, scales = [home.to(torch.bfloat16) for home in homes], None
        exact = kvs
    query = torch.randn(1, 2 * 4, 1, dim).to(torch.bfloat16)  # Llama-3's 4 query heads per KV head
    for stop in (1, 3, 15, 17, 63, 65, 130):
        expected = reference(query, exact, 0, stop, dim ** -0.5, None, None)
        for path in paths:
            monkeypatch.setenv(native.ENV_PATH, path)
            out = HostAttention(tile_bytes=1).attend(query, kvs, 0, stop, scaling=dim ** -0.5, scales=scales)
            error = float((out.double() - expected).abs().max() / expected.abs().max())
            assert error <= torch.finfo(torch.bfloat16).eps + 1e-6, (path, stop, error)


@pytest.mark.parametrize("kv_dtype", ["fp32", "fp16", "int8"])
def test_six_rows_a_kv_head_are_one_block_exact_for_every_mix_of_heads_and_queries(kv_dtype):
    """Six rows a KV head (Qwen2.5-1.5B's decode step: 6 query heads; or 3 x 2 and 2 x 3 query heads x tokens, whose
    rows are masked causally among themselves) run as one 6-row block on AVX-512 with head dim 128: within fp32
    rounding of float64 over the stored values (int8: the dequantized codes) with a window and a softcap, and of the
    build that runs them as 4 + 2 (``-DHA_ROWS6=0``), from whose sums it differs by their order only."""
    from engine.kv import quant
    from engine.native.library import compiler

    function = native.kernel()
    if function is None or not function.variant(native.PATHS["avx512"]):
        pytest.skip("no AVX-512 here: the 6-row block is its own")
    split = native.build(compiler(), ["-DHA_ROWS6=0"])
    torch.manual_seed(0)
    homes = [torch.randn(700, 1, 2, 2, 128) for _ in range(2)]  # [T, B, 2, g, D]
    if kv_dtype == "int8":
        coded = [quant.quantize(home, "int8") for home in homes]
        kvs, scales = [c for c, _ in coded], [p for _, p in coded]
        exact = [quant.dequantize(codes, plane, torch.empty(codes.shape)) for codes, plane in coded]
    else:
        kvs = exact = [home.to(getattr(torch, {"fp32": "float32", "fp16": "float16"}[kv_dtype])) for home in homes]
        scales = None
    differs = False
    for n_rep, q_len in ((6, 1), (3, 2), (2, 3)):
        for window, softcap in ((None, None), (300, None), (None, 30.0)):
            query = torch.randn(1, 2 * 2 * n_rep, q_len, 128)  # [B, H, Q, D] fp32: a CPU model's
            expected = reference(query, exact, 0, 700, 0.1, window, softcap)
            outs = []
            for library in (None, split):
                out = torch.empty_like(query)
                native.attend_layer(query, kvs, 0, 700, out, scaling=0.1, window=window, softcap=softcap,
                                    scales=scales, function=library)
                outs.append(out)
            scale = expected.abs().max()
            assert (outs[0].double() - expected).abs().max() <= 1e-5 * scale, (n_rep, q_len, window, softcap)
            assert (outs[0].double() - outs[1].double()).abs().max() <= 1e-5 * scale
            differs |= not torch.equal(outs[0], outs[1])
    assert differs  # the 6-row block ran: its sums are in another order than 4 + 2's


@pytest.mark.parametrize("window, softcap", [(None, None), (200, None), (None, 30.0)], ids=["full", "window", "softcap"])
def test_a_prefill_blocks_fp32_keys_transposed_once_a_chunk_score_exactly(window, softcap):
    """A CPU prefill block (64 query tokens x 6 query heads a KV head: 384 rows) over fp32 homes, head dim 128: on
    AVX-512 each chunk's keys are transposed once and its 4-row blocks scored as an outer product. Lengths on and
    off the 64-token chunks, the block's own keys masked causally: within fp32 rounding of float64 and of the build
    that scores them with the transpose-and-add tree (``-DHA_KEYS_TRANSPOSED=0``), and not bit-equal to it."""
    from engine.native.library import compiler

    function = native.kernel()
    if function is None or not function.variant(native.PATHS["avx512"]):
        pytest.skip("no AVX-512 here: the transposed keys are its path")
    tree = native.build(compiler(), ["-DHA_KEYS_TRANSPOSED=0"])
    torch.manual_seed(0)
    differs = False
    for stop in (64, 200, 700):
        home = torch.randn(stop, 1, 2, 2, 128)  # [T, B, 2, g, D] fp32: a CPU model's
        query = torch.randn(1, 12, 64, 128)  # [B, H, Q, D]: the last 64 positions of [0, stop)
        expected = reference(query, [home], 0, stop, 0.1, window, softcap)
        outs = []
        for library in (None, tree):
            out = torch.empty_like(query)
            native.attend_layer(query, [home], 0, stop, out, scaling=0.1, window=window, softcap=softcap,
                                function=library)
            outs.append(out)
        scale = expected.abs().max()
        assert (outs[0].double() - expected).abs().max() <= 1e-5 * scale, stop
        assert (outs[0].double() - outs[1].double()).abs().max() <= 1e-5 * scale, stop
        differs |= not torch.equal(outs[0], outs[1])
    assert differs  # the transposed keys ran: each score summed over the head dim in another order


def _bf16_values(shape) -> torch.Tensor:
    """fp32 tensor of bf16 values (what a bf16 model's queries are once widened)."""
    return torch.randn(shape).to(torch.bfloat16).float()


@pytest.mark.parametrize("window, softcap", [(None, None), (300, None), (None, 30.0)], ids=["full", "window", "softcap"])
@pytest.mark.parametrize("n_rep", [4, 6, 8], ids=["4-rows", "6-rows", "8-rows"])
def test_bf16_queries_over_bf16_homes_are_scored_by_bf16_dot_products_within_fp32_rounding(monkeypatch, window,
                                                                                           softcap, n_rep):
    """avx512bf16: bf16 homes of head dim 128 whose queries are bf16 values (bf16 tensors, or fp32 ones holding bf16
    values) are scored by vdpbf16ps (the tasks are counted), within the fp32 parity tolerance of float64 and of the
    AVX-512 path; queries that are not bf16 values take that path's widened keys and FMAs instead (no task
    counted), exact as before: rounding them to bf16 would be wrong by ~2^-9."""
    function = native.kernel()
    if function is None or not function.variant(native.PATHS["avx512bf16"]):
        pytest.skip("no AVX512_BF16 here")
    torch.manual_seed(0)
    kvs = [torch.randn(700, 1, 2, 1, 128).to(torch.bfloat16) for _ in range(2)]  # [T, B, 2, g, D]
    kernel = HostAttention(tile_bytes=64 << 10)
    for query, dots in ((_bf16_values((1, 2 * n_rep, 1, 128)), True), (torch.randn(1, 2 * n_rep, 1, 128), False)):
        expected = reference(query, kvs, 0, 700, 128**-0.5, window, softcap)
        monkeypatch.setenv(native.ENV_PATH, "avx512bf16")
        before = function.dot_tasks()
        out = kernel.attend(query, kvs, 0, 700, scaling=128**-0.5, window=window, softcap=softcap)
        assert (function.dot_tasks() > before) == dots
        monkeypatch.setenv(native.ENV_PATH, "avx512")  # the fallback of a CPU without bf16 dot products
        before = function.dot_tasks()
        widened = kernel.attend(query, kvs, 0, 700, scaling=128**-0.5, window=window, softcap=softcap)
        assert function.dot_tasks() == before
        scale = expected.abs().max()
        assert (out.double() - expected).abs().max() <= 1e-5 * scale
        assert (out.double() - widened.double()).abs().max() <= 1e-5 * scale
    bf16_query = _bf16_values((1, 2 * n_rep, 1, 128)).to(torch.bfloat16)  # a bf16 tensor: always bf16 values
    monkeypatch.setenv(native.ENV_PATH, "avx512bf16")
    before = function.dot_tasks()
    out = kernel.attend(bf16_query, kvs, 0, 700, scaling=128**-0.5, window=window, softcap=softcap)
    assert function.dot_tasks() > before
    expected = reference(bf16_query, kvs, 0, 700, 128**-0.5, window, softcap)
    assert (out.double() - expected).abs().max() <= (torch.finfo(torch.bfloat16).eps + 1e-6) * expected.abs().max()


def test_a_path_the_cpu_lacks_is_refused(monkeypatch):
    function = native.kernel()
    if function is None:
        pytest.skip("no C compiler here")
    missing = [name for name in ("avx2", "avx512", "avx512bf16") if not function.variant(native.PATHS[name])]
    if not missing:
        pytest.skip("this CPU runs every path")
    monkeypatch.setenv(native.ENV_PATH, missing[0])
    with pytest.raises(RuntimeError, match="not available"):
        native.attend_layer(torch.randn(1, 1, 1, 16), [torch.randn(4, 1, 2, 1, 16)], 0, 4,
                            torch.empty(1, 1, 1, 16), scaling=1.0)


def test_the_scratch_a_prefill_block_grew_is_given_back_by_the_next_decode_step():
    """A prefill chunk's query block keeps a partial of every row per task in the pool's scratch (up to 1/16 of a
    layer's home); kept, it would stay through every decode step after. The first decode step's call that needs
    under a quarter of it gives it back, and the next steps keep their small one; a prefill call needing little (a
    sliding-window layer's) keeps it; every result exact."""
    function = native.kernel()
    if function is None:
        pytest.skip("no C compiler here")
    torch.manual_seed(0)
    home = torch.randn(2048, 1, 2, 2, 128)  # [T, B, 2, g, D] fp32: a CPU default model's layer
    block = torch.randn(1, 12, 64, 128)  # a prefill query block: 64 queries, 6 rows each per KV head
    out = torch.empty_like(block)
    native.attend_layer(block, [home], 0, 2048, out, scaling=0.1, tile_bytes=1)  # 16-token tiles: 128 tasks
    grown = function.scratch_bytes()
    assert grown >= 128 * (2 * 6 * 64) * (128 + 2) * 4  # 128 tasks' partials of 768 rows
    expected = reference(block, [home], 0, 2048, 0.1, None, None)
    assert (out.double() - expected).abs().max() <= 1e-5 * expected.abs().max()
    # a sliding-window layer's block of the same prefill needs little: kept for the full layer next to it
    native.attend_layer(block, [home], 2048 - 64 - 100, 2048, out, scaling=0.1, window=100)
    assert function.scratch_bytes() == grown
    expected = reference(block, [home], 2048 - 64 - 100, 2048, 0.1, 100, None)
    assert (out.double() - expected).abs().max() <= 1e-5 * expected.abs().max()
    sizes = []
    for stop in (2049, 2050):  # two decode steps
        query, step = torch.randn(1, 12, 1, 128), torch.empty(1, 12, 1, 128)
        extended = torch.cat([home, torch.randn(stop - 2048, 1, 2, 2, 128)])
        native.attend_layer(query, [extended], 0, stop, step, scaling=0.1)
        sizes.append(function.scratch_bytes())
        expected = reference(query, [extended], 0, stop, 0.1, None, None)
        assert (step.double() - expected).abs().max() <= 1e-5 * expected.abs().max()
    assert sizes[0] < grown / 4 and sizes[1] == sizes[0], (grown, sizes)


def _cpu_vendor() -> str | None:
    try:
        with open("/proc/cpuinfo") as info:
            return next((line.split(":", 1)[1].strip() for line in info if line.startswith("vendor_id")), None)
    except OSError:
        return None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_the_prefetch_level_changes_when_lines_arrive_never_the_result(monkeypatch, dtype):
    """bf16/fp16/fp32 homes request their next lines into L1 (auto on AMD: prefetcht2 left a Zen 5 core's loads
    waiting) or into L2 (auto elsewhere): on every vector path the level reaches the tasks (counted) and the
    outputs are bit for bit the same; a value that names no level is ignored."""
    function = native.kernel()
    if function is None:
        pytest.skip("no C compiler here")
    vendor = _cpu_vendor()
    if vendor is not None:
        assert function.prefetch(native.PREFETCH["auto"]) == (1 if vendor == "AuthenticAMD" else 2), vendor
    assert [function.prefetch(native.PREFETCH[level]) for level in ("l1", "l2")] == [1, 2]
    torch.manual_seed(0)
    kvs = [torch.randn(700, 1, 2, 2, 128).to(dtype) for _ in range(2)]
    query = torch.randn(1, 2 * 2 * 6, 1, 128).to(dtype)  # 6 rows a KV head (4 + 2), Qwen2.5-1.5B's decode
    for path in _available_paths():
        monkeypatch.setenv(native.ENV_PATH, path)
        outs = {}
        for level in ("l1", "l2", "auto", "l3"):
            monkeypatch.setenv(native.ENV_PREFETCH, level)
            before = function.l1_prefetch_tasks()
            outs[level] = HostAttention(tile_bytes=64 << 10).attend(query, kvs, 0, 700, scaling=0.1, window=300)
            in_l1 = function.l1_prefetch_tasks() > before
            assert in_l1 == (function.prefetch(native.PREFETCH[native.forced_prefetch()]) == 1), (path, level)
        assert native.forced_prefetch() == "auto"  # "l3" names no level
        assert all(torch.equal(out, outs["l2"]) for out in outs.values()), path


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_8bit_homes_give_what_dequantize_then_attend_gives(kv_dtype, dtype):
    from engine.kv import quant

    if native.kernel() is None:
        pytest.skip("no C compiler here")
    torch.manual_seed(0)
    homes = [torch.randn(500, 1, 2, 2, 64) for _ in range(2)]  # [T, B, 2, g, D]
    coded = [quant.quantize(home, kv_dtype) for home in homes]
    dequantized = [quant.dequantize(codes, scales, torch.empty(codes.shape)) for codes, scales in coded]
    query = torch.randn(1, 2 * 2 * 3, 4, 64).to(dtype)
    kernel = HostAttention(tile_bytes=16 << 10)
    from_codes = kernel.attend(query, [c for c, _ in coded], 0, 500, scaling=0.125, window=200,
                               scales=[s for _, s in coded])
    from_copy = kernel.attend(query, dequantized, 0, 500, scaling=0.125, window=200)
    # codes * scale is the fp32 dequantized value: only the order of the fp32 sums differs (and the output's
    # rounding to bf16, at most one unit in its last place)
    scale = from_copy.abs().max().double()
    assert (from_codes.double() - from_copy.double()).abs().max() <= (torch.finfo(dtype).eps + 1e-6) * scale


def test_without_a_compiler_the_torch_tile_runs_and_the_log_says_so(monkeypatch, caplog):
    monkeypatch.setattr(native, "compiler", lambda: None)
    with caplog.at_level("INFO", logger="engine.kv.native"):
        assert native.kernel.__wrapped__() is None
    assert "no C compiler found, using the torch tile" in caplog.text


# -- parity on every architecture ------------------------------------------------------------------------
@pytest.fixture(scope="module", params=sorted(tiny_configs()))
def pair(request, tmp_path_factory):
    stock, headinfer = build_pair(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, stock, headinfer


def prompt(vocab_size: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(7))


def host_cache(config, split: bool):
    """Every group offloaded; every one attended on the host, or (``split``) half of the bytes as on CUDA."""
    cache = engine.HeadInferCache(config, head_group_size=1, resident_slots=0, chunk_size=CHUNK,
                                  host_attention="off" if split else "all")
    if split:  # the share the planner picks on CUDA from measured rates; CPU compute plans none by itself
        cache.plan = dataclasses.replace(cache.plan, host_attention="auto", host_share=0.5)
    return cache


@pytest.mark.parametrize("split", [False, True], ids=["all-on-host", "split"])
@torch.inference_mode()
def test_decode_with_host_attention_matches_stock(pair, split):
    name, stock, headinfer = pair
    ids = prompt(stock.config.get_text_config().vocab_size)
    stock_cache = DynamicCache(config=stock.config)
    expected = [stock(ids, past_key_values=stock_cache, use_cache=True).logits[:, -1]]
    cache = host_cache(headinfer.config, split)
    actual = [torch.cat([headinfer(ids[:, s : s + CHUNK], past_key_values=cache).logits
                         for s in range(0, PROMPT_LEN, CHUNK)], dim=1)[:, -1]]
    for _ in range(12):  # past the windows: decode must slide them on the host too
        token = expected[-1].argmax(-1, keepdim=True)
        expected.append(stock(token, past_key_values=stock_cache, use_cache=True).logits[:, -1])
        actual.append(headinfer(token, past_key_values=cache).logits[:, -1])
    for step, (a, e) in enumerate(zip(actual, expected)):
        assert rel_diff(a, e) < RTOL, (name, step)
    host_slots, slots = cache.schedule.host_slots, cache.plan.total_slots
    assert 0 < len(host_slots) < slots if split else len(host_slots) == slots
    assert cache.host_attention_seconds > 0


@torch.inference_mode()
def test_generate_greedy_tokens_identical_with_every_group_on_the_host(pair):
    name, stock, headinfer = pair
    ids = prompt(stock.config.get_text_config().vocab_size)
    kwargs = dict(max_new_tokens=20, do_sample=False, min_new_tokens=20)
    expected = stock.generate(ids, **kwargs)
    cache = engine.HeadInferCache(headinfer.config, resident_slots=0, host_attention="all")
    actual = headinfer.generate(ids, past_key_values=cache, prefill_chunk_size=CHUNK, **kwargs)
    assert torch.equal(actual, expected), name


@torch.inference_mode()
def test_split_decode_fetches_only_streamed_slots_and_finds_them_prefetched(tmp_path):
    _, headinfer = build_pair("llama-gqa", tmp_path)
    cache = host_cache(headinfer.config, split=True)
    headinfer(prompt(97)[:, :CHUNK], past_key_values=cache)  # a host step: primes the streamed prefetch
    headinfer(torch.tensor([[1]]), past_key_values=cache)
    fetches, on_demand = cache.transfer.num_fetches, cache.transfer.num_on_demand
    for step in range(3):
        headinfer(torch.tensor([[step + 2]]), past_key_values=cache)
    streamed = cache.plan.total_slots - len(cache.schedule.host_slots)
    assert cache.transfer.num_fetches - fetches == 3 * streamed  # host slots never cross to the device
    assert cache.transfer.num_on_demand == on_demand, "a streamed slot was fetched on demand"


@torch.inference_mode()
def test_prefill_chunks_longer_than_the_host_limit_stay_on_the_device(tmp_path):
    _, headinfer = build_pair("llama-gqa", tmp_path)
    cache = engine.HeadInferCache(headinfer.config, resident_slots=0, chunk_size=32, host_attention="all")
    headinfer(prompt(97)[:, :32], past_key_values=cache)
    assert cache.host_attention_seconds == 0
    headinfer(torch.tensor([[1]]), past_key_values=cache)
    assert cache.host_attention_seconds > 0


# -- policy, split, forecast, rates, workers ------------------------------------------------------------
def test_policy_validates_host_attention():
    assert engine.OffloadPolicy().host_attention == "auto"
    with pytest.raises(ValueError, match="host_attention must be one of 'auto', 'off', 'all'"):
        engine.OffloadPolicy(host_attention="gpu")


def test_share_balances_the_two_halves_and_auto_is_off_without_cuda():
    assert host_share("auto", True, 75.0, 25.0) == 0.75
    assert host_share("auto", False, 75.0, 25.0) == 0.0
    assert host_share("auto", False, None, None, quantized=True) == 1.0  # CPU, 8-bit homes: read codes in place
    assert host_share("off", False, None, None, quantized=True) == 0.0
    assert host_share("all", False, None, None) == 1.0 and host_share("off", True, 75.0, 25.0) == 0.0
    forecast = forecast_decode(100 * 10**9, 0.75, 75.0, 25.0)
    assert forecast.pcie_floor_seconds == pytest.approx(4.0)
    assert forecast.seconds == pytest.approx(1.0)  # both halves: 25 GB over the link, 75 GB on the host


def test_the_split_puts_groups_on_a_fast_enough_host_and_none_on_a_slow_one():
    llama = ModelShape(32, 32, 8, 128, 4096, 14336, 128256, 2, 8_030_000_000, (None,) * 32)
    policy = engine.OffloadPolicy(head_group_size=1, resident_slots=0)
    kv_bytes = (1 << 17) * llama.kv_bytes_per_token
    # A 4090 PC: 24 GB/s link, the host kernel at 60 GB/s: both halves finish together with ~70% on the host.
    desktop = machine_rates.MachineRates(host_attention_gbps=60.0, h2d_gbps=24.0, is_h2d_measured=True)
    plan = make_plan(llama, policy, 1 << 17, device_is_cuda=True, rates=desktop)
    assert plan.host_share == pytest.approx(60 / 84) and 0.69 < plan.host_share < 0.73
    # vs kv_bytes / 24e9 all streamed; each of the 32 layers waits for the host's half once
    assert plan.decode_seconds == pytest.approx(kv_bytes / 84e9 + 32 * HOST_LAYER_SECONDS)
    assert plan.decode_seconds < 0.5 * plan.pcie_floor_seconds
    slots = [(layer, group) for layer in range(32) for group in range(8)]
    on_host = choose_host_slots(slots, [1] * len(slots), plan.host_share)
    assert len(on_host) == round(0.714 * 256) and {layer for layer, _ in on_host} == set(range(32))
    # The old kernel's rate on the GPU machine (0.85 GB/s at 32K): a share so small that no group goes to the host.
    slow = machine_rates.MachineRates(host_attention_gbps=0.85, h2d_gbps=55.0, is_h2d_measured=True)
    slow_share = make_plan(llama, policy, 1 << 17, device_is_cuda=True, rates=slow).host_share
    assert slow_share < 0.02 and choose_host_slots(slots[:32], [1] * 32, slow_share) == frozenset()


def test_auto_streams_everything_where_the_host_layers_round_trips_eat_the_gain():
    """The H200 of 2026-11-27 (host kernel ~65-69 GB/s beside the copies, link 55): the planner's old split (56%
    on the host at every length) made decode at 32K 1.6-1.8x slower than streaming, and was 0.6-0.9x of
    streaming at 128K and 512K (docs/benchmarks/runs/2026-11-27b)."""
    llama = ModelShape(32, 32, 8, 128, 4096, 14336, 128256, 2, 8_030_000_000, (None,) * 32)
    policy = engine.OffloadPolicy(head_group_size=1, resident_slots=0)
    h200 = machine_rates.MachineRates(host_attention_gbps=69.0, h2d_gbps=55.0, is_h2d_measured=True)
    shares = {tokens: make_plan(llama, policy, tokens, device_is_cuda=True, rates=h200)
              for tokens in (1 << 10, 1 << 15, 1 << 17, 1 << 19)}
    assert shares[1 << 10].host_share == shares[1 << 15].host_share == 0.0
    assert shares[1 << 15].decode_seconds == pytest.approx(shares[1 << 15].pcie_floor_seconds)
    for tokens in (1 << 17, 1 << 19):
        plan = shares[tokens]
        assert plan.host_share == pytest.approx(69 / 124)
        assert plan.decode_seconds < (1 - MIN_GAIN) * plan.pcie_floor_seconds
    # measured there, split / PCIe floor: 0.69-0.86 at 128K, 0.57-0.60 at 512K; the forecast (KV movement and
    # the host layers' round trips, no weights or compute)
    assert 0.7 < shares[1 << 17].decode_seconds / shares[1 << 17].pcie_floor_seconds < 0.8
    assert 0.45 < shares[1 << 19].decode_seconds / shares[1 << 19].pcie_floor_seconds < 0.55
    # 8-bit homes: the link and the host read codes and scales, 1 + 4/128 bytes an element instead of 2.
    int8 = make_plan(llama, dataclasses.replace(policy, kv_dtype="int8"), 1 << 17, device_is_cuda=True, rates=h200)
    assert int8.pcie_floor_seconds == pytest.approx(shares[1 << 17].pcie_floor_seconds * (1 + 4 / 128) / 2)
    # Without the bytes (a caller that knows no context) the share is the plain balance.
    assert host_share("auto", True, 69.0, 55.0) == pytest.approx(69 / 124)
    # A slower round trip moves the break-even to longer contexts.
    bytes_128k = (1 << 17) * llama.kv_bytes_per_token
    assert host_share("auto", True, 69.0, 55.0, offloaded_bytes=bytes_128k, host_layers=32, layer_seconds=0.0035) > 0
    assert host_share("auto", True, 69.0, 55.0, offloaded_bytes=bytes_128k, host_layers=32, layer_seconds=0.006) == 0


def test_only_the_layers_with_host_slots_pay_the_round_trip():
    """One group a layer (the adaptive plan's head group of 8 KV heads) and 24 of 32 layers resident: the host's
    share of the 8 offloaded slots is 4 layers' worth, so 4 layers wait for the host, not 32 (which would forecast
    no gain and stream everything)."""
    llama = ModelShape(32, 32, 8, 128, 4096, 14336, 128256, 2, 8_030_000_000, (None,) * 32)
    policy = engine.OffloadPolicy(head_group_size=8, resident_slots=24)
    h200 = machine_rates.MachineRates(host_attention_gbps=69.0, h2d_gbps=55.0, is_h2d_measured=True)
    plan = make_plan(llama, policy, 1 << 17, device_is_cuda=True, rates=h200)
    assert (plan.num_groups, plan.resident_slots) == (1, 24)
    offloaded = 8 * (1 << 17) * llama.kv_bytes_per_token // 32
    share = 69 / 124
    assert plan.host_share == pytest.approx(share)
    both_halves = max(share * offloaded / 69e9, (1 - share) * offloaded / 55e9)
    assert plan.decode_seconds == pytest.approx(both_halves + round(share * 8) * HOST_LAYER_SECONDS, rel=1e-4)
    slots = [(layer, 0) for layer in range(24, 32)]  # whichever layers are offloaded: one slot each
    assert len(choose_host_slots(slots, [1] * 8, plan.host_share)) == round(share * 8)
    # "all" on the same plan: every offloaded layer waits
    everything = make_plan(llama, dataclasses.replace(policy, host_attention="all"), 1 << 17, device_is_cuda=True,
                           rates=h200)
    assert everything.decode_seconds == pytest.approx(offloaded / 69e9 + 8 * HOST_LAYER_SECONDS, rel=1e-4)


def test_a_cache_planned_with_the_machines_rates_logs_its_split_and_forecast(caplog):
    """Issue 29: the log says the split and the predicted step time when a cache is built from a plan that has the
    machine's rates (as the app's are); a cache that planned itself (no rates) has no forecast to say."""
    config = tiny_configs()["llama-gqa"]
    shape = ModelShape.from_config(config, dtype_bytes=4)
    policy = engine.OffloadPolicy(head_group_size=1, resident_slots=0, kv_dtype="int8", max_context=256)
    machine = machine_rates.MachineRates(host_attention_gbps=10.0, h2d_gbps=25.0, is_h2d_measured=False)
    plan = make_plan(shape, policy, 256, device_is_cuda=False, rates=machine)
    with caplog.at_level("INFO", logger="engine.cache"):
        engine.HeadInferCache(config, policy, plan=plan, dtype=torch.float32).allocate(1, shape.head_dim,
                                                                                      torch.float32, "cpu")
    lines = [r.getMessage() for r in caplog.records if "of offloaded KV attended on the host" in r.getMessage()]
    assert lines == [f"HeadInferCache {plan.decode_line()}"]
    assert "100% of offloaded KV attended on the host (auto), predicted" in lines[0]  # CPU, 8-bit homes
    caplog.clear()
    with caplog.at_level("INFO", logger="engine.cache"):
        engine.HeadInferCache(config, policy, dtype=torch.float32).allocate(1, shape.head_dim, torch.float32, "cpu")
    assert not [r for r in caplog.records if "attended on the host (" in r.getMessage()]


def test_host_slots_carry_the_share_of_bytes_spread_over_layers():
    slots = [(layer, group) for layer in range(8) for group in range(4)]
    chosen = choose_host_slots(slots, [1] * len(slots), 0.25)
    assert len(chosen) == 8 and {layer for layer, _ in chosen} == set(range(8))  # one per layer
    one_per_layer = choose_host_slots([(l, 0) for l in range(8)], [1] * 8, 0.5)
    assert sorted(one_per_layer) == [(1, 0), (3, 0), (5, 0), (7, 0)]  # alternating layers
    # A full-attention slot outweighs sliding ones: bytes, not slot counts, are balanced.
    weighted = choose_host_slots([(0, 0), (1, 0), (2, 0), (3, 0)], [1, 1, 1, 9], 0.75)
    assert (3, 0) in weighted


def test_plan_shows_the_split_and_the_predicted_decode_time():
    llama = ModelShape(32, 32, 8, 128, 4096, 14336, 128256, 2, 8_030_000_000, (None,) * 32)
    machine = machine_rates.MachineRates(host_attention_gbps=75.0, h2d_gbps=25.0, is_h2d_measured=True)
    policy = engine.OffloadPolicy(head_group_size=1, resident_slots=0)
    plan = make_plan(llama, policy, 1 << 17, device_is_cuda=True, rates=machine)
    kv_bytes = (1 << 17) * llama.kv_bytes_per_token
    assert plan.host_share == 0.75
    assert plan.pcie_floor_seconds == pytest.approx(kv_bytes / 25e9)
    assert plan.decode_seconds == pytest.approx(kv_bytes / 100e9 + 32 * HOST_LAYER_SECONDS)
    assert "75% of offloaded KV attended on the host" in plan.summary()
    assert f"predicted {plan.decode_seconds:.3f} s/token of KV movement and host round trips" in plan.summary()
    off = make_plan(llama, dataclasses.replace(policy, host_attention="off"), 1 << 17, device_is_cuda=True,
                    rates=machine)
    assert off.host_share == 0 and off.decode_seconds == pytest.approx(off.pcie_floor_seconds)
    assert make_plan(llama, policy, 1 << 17, device_is_cuda=True).decode_seconds is None  # no rates, no forecast


def test_machine_rates_are_measured_once_and_cached(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(machine_rates, "measure_host_attention_gbps", lambda: calls.append(1) or 42.0)
    first = machine_rates.machine_rates("cpu", cache_path=tmp_path / "rates.json")
    second = machine_rates.machine_rates("cpu", cache_path=tmp_path / "rates.json")
    assert first == second == machine_rates.MachineRates(42.0, machine_rates.DEFAULT_H2D_GBPS, False)
    assert len(calls) == 1
    assert machine_rates.plan_rates(engine.OffloadPolicy(), "cpu") is None  # CPU compute plans no split


def test_workers_run_single_threaded_and_leave_the_callers_threads_alone():
    before = torch.get_num_threads()
    workers = TorchWorkers(2)
    try:
        assert workers.submit(torch.get_num_threads).result() == 1
        assert torch.get_num_threads() == before
        seen = []
        fresh = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        fresh.start()
        fresh.join()
        assert seen == [before]  # a thread that starts later (a UI's generation thread) keeps every core
    finally:
        workers.shutdown()


def test_the_kernel_passes_its_probe_where_it_builds():
    """The probe runs the built kernel on fp32, bf16 and fp16 homes in a child: where it builds, it passes (else the
    C kernel would silently give way to the torch tile everywhere)."""
    if native._unprobed_kernel() is None:
        pytest.skip("no C compiler here")
    native.exercise_kernel()  # the probe's own checks, in this process
    assert native.kernel() is not None


def test_a_kernel_that_crashes_its_probe_costs_a_child_and_the_torch_tile_runs(tmp_path, monkeypatch):
    built = native._unprobed_kernel()
    if built is None:
        pytest.skip("no C compiler here")
    monkeypatch.setattr(native, "_unprobed_kernel", lambda: built)  # (not built again in the empty cache)
    monkeypatch.setenv("HEADINFER_CACHE", str(tmp_path))  # no probe answer remembered
    monkeypatch.setattr(native, "PROBE", "os:abort")  # a child that dies as an illegal instruction would
    native.kernel.cache_clear()
    try:
        assert native.kernel() is None  # and this process is still here to say so
        assert died_of_abort(tmp_path, "host-attention")
        query = torch.randn(1, 4, 1, 64)
        assert not native.can_attend(query, [torch.randn(9, 1, 2, 2, 64)])  # the caller takes the torch tile
    finally:
        native.kernel.cache_clear()


def _attend_on(pool: int, query, kvs, out) -> None:
    """One call on the kernel's own pool (0) or its split pool (1), after a call of -query: every task's partial in
    the scratch is then another's, so a task the pool skipped shows in the output."""
    function = native.kernel()
    previous = function.use_split_pool(pool)
    try:
        for q in (-query, query):
            native.attend_layer(q, kvs, 0, 700, out, scaling=0.088, num_threads=2, tile_bytes=64 << 10)
    finally:
        function.use_split_pool(previous)


def test_the_split_pool_when_chosen_runs_the_calls_and_gives_the_own_pools_bits(monkeypatch):
    # HEADINFER_HOST_POOL=split (docs/benchmarks/thread-pools.md): the same tiles and merge on split_pool.h's workers
    if native.kernel() is None:
        pytest.skip("no C compiler here: the torch tile is the one in use")
    monkeypatch.setattr(native, "_shared_pool", None)  # no GEMV library's pool: the kernel's own two
    function = native.kernel()
    torch.manual_seed(0)
    kvs = [torch.randn(700, 1, 2, 2, 128) for _ in range(2)]  # 2 groups of 2 KV heads: 22 tiles of 64 KiB each
    query = torch.randn(1, 24, 1, 128)
    own = torch.full(query.shape, float("nan"))
    _attend_on(0, query, kvs, own)
    split_before, own_before = function.split_worker_tasks(), function.own_worker_tasks()
    results, deadline = [], time.monotonic() + 60
    # the caller may take every task of many calls before the OS runs a worker on a loaded machine: on until one did
    while len(results) < 5 or (function.split_worker_tasks() == split_before and time.monotonic() < deadline):
        out = torch.full(query.shape, float("nan"))
        _attend_on(1, query, kvs, out)
        results.append(torch.equal(out, own))
    assert all(results)
    assert function.split_worker_tasks() > split_before  # the split pool's workers took tasks ...
    assert function.own_worker_tasks() == own_before  # ... and the own pool's none


@pytest.mark.parametrize("value, split", [("split", 1), ("own", 0), ("", 0), ("spinning", 0)])
def test_the_environment_chooses_the_pool_and_the_own_one_is_the_default(monkeypatch, value, split):
    if native.kernel() is None:
        pytest.skip("no C compiler here: the torch tile is the one in use")
    initial = native.kernel().use_split_pool(0)
    monkeypatch.setenv(native.ENV_POOL, value)
    try:
        native._unprobed_kernel()  # the one library, loaded again as a start loads it: the setting is the process's
        assert native.kernel().use_split_pool(initial) == split
    finally:
        native.kernel().use_split_pool(initial)


def test_a_child_forked_mid_call_gets_a_pool_of_its_own():
    # fork copies only the calling thread: a child forked while another thread is inside the kernel inherits the pool's
    # call lock held and workers that do not exist; the pool's atfork handler gives the child a fresh one. The child
    # touches only the C library (no torch) and must finish a pooled call in time. A fork lands inside the other
    # thread's call about half the time (it may land while that thread waits for the GIL between calls), so ten
    # forks: without the handler, one of them hangs all but once in a thousand runs.
    import ctypes
    import os
    import time

    if native.kernel() is None:
        pytest.skip("no C compiler here: the torch tile is the one in use")
    read, variant = native.kernel().read, native.PATHS[native.forced_path()]
    size = 256 << 20  # ~10 ms a read: the other thread is inside the kernel most of the time
    buffer = ctypes.create_string_buffer(size)  # zeros: floats summing to 0
    address = ctypes.addressof(buffer)
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            read(address, size, 2, variant)

    thread = threading.Thread(target=busy)
    thread.start()
    try:
        for _ in range(10):
            time.sleep(0.05)
            child = os.fork()
            if child == 0:
                os._exit(0 if read(address, size, 2, variant) == 0.0 else 3)
            deadline = time.monotonic() + 20
            while (done := os.waitpid(child, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
                time.sleep(0.01)
            if done == (0, 0):
                os.kill(child, 9)
                os.waitpid(child, 0)
                pytest.fail("a child forked mid-call never finished its own pooled call")
            assert os.waitstatus_to_exitcode(done[1]) == 0
    finally:
        stop.set()
        thread.join()
