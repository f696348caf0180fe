"""int8 weights times fp32 activations on the CPU, exactly: ``x @ (codes * scales[:, None]).T + bias`` in fp32.

torch's int8 CPU kernel (``aten._weight_int8pack_mm``) takes bf16 activations only (its fp32 path is a scalar loop);
an int8 model then computes in bf16, whose elementwise ops this kind of CPU emulates, and whose attention cannot take
the C decode tile (``engine.kv.kernels``) without leaving stock transformers' tokens. Here:

- decode steps (at most ``GEMV_ROWS`` rows): ``int8_gemv.c``, built once per machine like the host attention tile,
  reads each weight's int8 code once and sums in fp32; output rows split over the host worker pool when torch may
  use several threads (ctypes releases the GIL);
- longer inputs (prefill chunks): the layer's weight dequantized to fp32 for the call and multiplied by torch's
  fp32 matmul, whose blocked kernels do that better. Both give the products of the same fp32 numbers.

``kernel()`` is None where no C compiler is found: then int8 models compute in bf16 as before (``quantize_int8``).
"""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch
import torch.nn.functional as F

from ..kv import native
from ..kv.workers import shared_workers

logger = logging.getLogger(__name__)

GEMV_ROWS = 16  # rows from which the dequantize-and-matmul path is faster (prefill chunks)
_SPLIT_BYTES = 1 << 20  # layers with fewer weight bytes run on the calling thread: a hand-off costs more than it saves
_SOURCE = Path(__file__).with_name("int8_gemv.c")
_P, _L = ctypes.c_void_p, ctypes.c_long
_ARGTYPES = [_P, _P, _P, _P, _P, _L, _L, _L, _L, _L]  # x, codes, scales, bias, y, rows, in, out, lo, hi


@functools.cache
def kernel():
    """The C function, or None (no compiler, or the build failed: logged)."""
    compiler = native.compiler()
    if compiler is None:
        logger.info("int8 weights: no C compiler found; int8 models compute in bf16")
        return None
    library = native.load_library(compiler, _SOURCE, [[]])
    if library is None:
        return None
    function = library.int8_gemv
    function.argtypes, function.restype = _ARGTYPES, ctypes.c_int
    return function


def int8_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x: [..., in] fp32; codes: [out, in] int8; scales: [out] fp32; bias: [out] fp32 or None. Returns [..., out]."""
    out_features, in_features = codes.shape
    rows = x.numel() // in_features
    function = kernel()
    if rows > GEMV_ROWS or function is None or in_features % 8:
        weight = codes.to(torch.float32).mul_(scales[:, None])  # exact: the scales are powers of two
        return F.linear(x, weight, bias)
    flat = x.contiguous()  # [..., in] read as [M, in]
    y = torch.empty(*x.shape[:-1], out_features)  # [..., out] written as [M, out]
    args = (flat.data_ptr(), codes.data_ptr(), scales.data_ptr(), 0 if bias is None else bias.data_ptr(),
            y.data_ptr(), rows, in_features, out_features)
    run_split(function, args, out_features, codes.numel(), _check)
    return y


def run_split(function, args: tuple, out_features: int, weight_bytes: int, check) -> None:
    """``check(function(*args, lo, hi))`` over output rows [0, out_features): on this thread for a small layer,
    else in ranges of whole groups of 4 rows, one per worker of the host pool (this thread waiting). A C GEMV's
    call releases the GIL (ctypes), so the ranges run at once."""
    parts = 1 if weight_bytes < 2 * _SPLIT_BYTES else min(torch.get_num_threads(), weight_bytes // _SPLIT_BYTES)
    if parts == 1:
        check(function(*args, 0, out_features))
        return
    step = ((out_features + parts - 1) // parts + 3) // 4 * 4
    futures = [shared_workers().submit(function, *args, lo, min(lo + step, out_features))
               for lo in range(0, out_features, step)]
    for future in futures:
        check(future.result())


def _check(status: int) -> None:
    assert status == 0, "int8_gemv: the input width must be a multiple of 8"
