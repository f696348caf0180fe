"""int8 codes times fp32 activations (``engine.models.int8_matmul``): the C GEMV of decode rows and the
dequantize-and-matmul of prefill chunks both give the fp32 product of the dequantized weight."""

from __future__ import annotations

import pytest
import torch

from engine.models import int8_matmul
from engine.models.int8 import quantize_rows


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
