"""int8 codes times fp32 activations (``engine.cpu.int8_matmul``): the C GEMV of decode rows and the
dequantize-and-matmul of prefill chunks both give the fp32 product of the dequantized weight; bf16 activations take
torch's kernel only where its probe survived in a child process, and give the same product on an AVX2-only CPU."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.native import crash_probe
from engine.cpu import int8_matmul
from engine.cpu.int8 import quantize_rows


def _layer(out_features: int, in_features: int, seed: int = 0):
    torch.manual_seed(seed)
    codes, scales = quantize_rows(torch.randn(out_features, in_features), torch.float32)
    return codes, scales, torch.randn(out_features)


def _float64(x, codes, scales, bias):
    weight = codes.double() * scales.double()[:, None]
    out = x.double() @ weight.T
    return out if bias is None else out + bias.double()


@pytest.mark.parametrize("rows", [1, 3, int8_matmul.GEMV_ROWS, int8_matmul.GEMV_ROWS + 1, 64])
@pytest.mark.parametrize("out_features", [40, 41, 1537])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_product_of_the_dequantized_weight(rows, out_features, with_bias):
    codes, scales, bias = _layer(out_features, 576)
    bias = bias if with_bias else None
    x = torch.randn(2, rows, 576)
    actual = int8_matmul.int8_linear(x, codes, scales, bias)
    assert actual.shape == (2, rows, out_features) and actual.dtype == torch.float32
    expected = _float64(x, codes, scales, bias)
    assert float((actual.double() - expected).abs().max() / expected.abs().max()) < 1e-6


def test_decode_rows_run_in_the_c_kernel(monkeypatch):
    """Fails if the C path were skipped: the dequantizing path's matmul is replaced by one that raises."""
    if int8_matmul.kernel() is None:
        pytest.skip("no C compiler here: int8 models compute in bf16")

    def no_dense(*args, **kwargs):
        raise AssertionError("a decode row took the dequantize-and-matmul path")

    monkeypatch.setattr(int8_matmul.F, "linear", no_dense)
    codes, scales, bias = _layer(300, 64)
    x = torch.randn(1, 64)
    torch.testing.assert_close(int8_matmul.int8_linear(x, codes, scales, bias),
                               _float64(x, codes, scales, bias).float(), rtol=1e-5, atol=1e-5)


def test_rows_split_over_the_workers_give_the_same_result(monkeypatch):
    if int8_matmul.kernel() is None:
        pytest.skip("no C compiler here: int8 models compute in bf16")
    codes, scales, bias = _layer(1029, 256)
    x = torch.randn(3, 256)
    alone = int8_matmul.int8_linear(x, codes, scales, bias)
    monkeypatch.setattr(int8_matmul, "_SPLIT_BYTES", 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        split = int8_matmul.int8_linear(x, codes, scales, bias)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(split, alone)  # the same sums, each output row computed whole by one thread


# --- bf16 activations: torch's private kernel only where its probe (a child process) ran cleanly -------------------

def segfaults() -> None:
    """A probe target that dies as torch's kernel did on this CPU (AVX-512, misaligned codes)."""
    os.kill(os.getpid(), signal.SIGSEGV)


def counts_its_runs() -> None:
    folder = Path(os.environ["HEADINFER_CACHE"])
    (folder / f"run-{os.getpid()}").touch()


@pytest.fixture
def fresh_probes(tmp_path, monkeypatch):
    """An empty cache folder and no probe answer remembered in this process (nor left behind for later tests)."""
    monkeypatch.setenv("HEADINFER_CACHE", str(tmp_path))
    int8_matmul.torch_kernel_is_safe.cache_clear()
    yield tmp_path
    int8_matmul.torch_kernel_is_safe.cache_clear()


def test_a_probe_that_crashes_costs_a_child_and_the_bf16_layer_takes_our_kernel(fresh_probes, monkeypatch):
    monkeypatch.setattr(int8_matmul, "TORCH_PROBE", f"{__name__}:segfaults")

    def no_torch_kernel(*args):
        raise AssertionError("torch's kernel ran though its probe crashed")

    monkeypatch.setattr(torch, "_weight_int8pack_mm", no_torch_kernel)
    assert int8_matmul.torch_kernel_is_safe() is False  # this process is still here to say so
    record = json.loads(next((fresh_probes / "kernels" / "probes").glob("torch-int8pack-mm-*.json")).read_text())
    assert record["survives"] is False and record["detail"].startswith(f"signal {int(signal.SIGSEGV)}")
    codes, scales, bias = _layer(300, 64)
    x = torch.randn(5, 64).to(torch.bfloat16)
    actual = int8_matmul.int8_linear_bf16(x, codes, scales.to(torch.bfloat16), bias.to(torch.bfloat16))
    expected = _float64(x, codes, scales, bias.to(torch.bfloat16))
    assert actual.dtype == torch.bfloat16 and rel(actual, expected) < 1e-2


def test_a_probe_runs_once_per_cpu_and_key_and_is_remembered_on_disk(fresh_probes):
    target = f"{__name__}:counts_its_runs"
    assert crash_probe.survives("count", target, ("torch 1",)) and crash_probe.survives("count", target, ("torch 1",))
    assert len(list(fresh_probes.glob("run-*"))) == 1
    assert crash_probe.survives("count", target, ("torch 2",))  # another torch: probed again
    assert len(list(fresh_probes.glob("run-*"))) == 2


@pytest.mark.parametrize("offset", [0, 8, 58])  # 58: where the weights cache's mapped codes of a tiny model began
@pytest.mark.parametrize("rows", [1, 4, 17])
def test_bf16_layer_is_the_product_of_the_dequantized_weight_wherever_the_codes_start(rows, offset):
    """In-process on this CPU: torch's AVX-512 kernel segfaulted here (4+ rows, codes off a 32-byte boundary)."""
    codes, scales, bias = _layer(1537, 576)
    storage = torch.empty(codes.numel() + 64, dtype=torch.int8)
    start = (-storage.data_ptr()) % 64 + offset
    shifted = storage[start : start + codes.numel()].view_as(codes).copy_(codes)
    x = torch.randn(rows, 576).to(torch.bfloat16)
    actual = int8_matmul.int8_linear_bf16(x, shifted, scales.to(torch.bfloat16), None)
    assert actual.shape == (rows, 1537) and rel(actual, _float64(x, codes, scales, None)) < 1e-2


def rel(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.double() - expected).abs().max() / expected.abs().max())


# --- an AVX2-only CPU: torch's kernels and ours as such a CPU runs them --------------------------------------------

@pytest.mark.slow  # a child pytest per variant: minutes each
@pytest.mark.parametrize("arch", ["x86-64-v3", "x86-64"], ids=["avx2", "portable"])
def test_int8_bf16_and_fp32_on_an_avx2_cpu(arch, tmp_path):
    """This file's tests and the bf16 parity of one tiny family in a child whose torch runs its AVX2 kernels
    (``ATEN_CPU_CAPABILITY``) and whose C kernels are built for AVX2 (or the portable C), with fresh probes."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the AVX2 emulation is for x86 CPUs")
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2", HEADINFER_NATIVE_ARCH=arch, HEADINFER_CACHE=str(tmp_path),
               HEADINFER_TEST_CACHE=str(tmp_path))
    tests = Path(__file__).parent
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not avx2_cpu",
                           str(tests / "test_int8_matmul.py"),
                           f"{tests / 'test_int8.py'}::test_int8_weights_match_stock_running_the_same_weights"
                           "[llama-gqa-bf16]"],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    records = [json.loads(p.read_text()) for p in (tmp_path / "kernels" / "probes").glob("*.json")]
    keys = {record["name"]: record["key"] for record in records}
    assert keys["torch-int8pack-mm"][1] == "AVX2" and keys["int8-gemv"][1] == arch


def test_the_cpu_capability_asked_for_is_the_one_torch_runs():
    asked = os.environ.get("ATEN_CPU_CAPABILITY")
    if asked is None:
        pytest.skip("no ATEN_CPU_CAPABILITY here (the AVX2 test above sets it for its child)")
    assert torch.backends.cpu.get_cpu_capability() == asked.upper()
