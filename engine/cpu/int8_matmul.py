"""int8 weights times fp32 activations on the CPU, exactly: ``x @ (codes * scales[:, None]).T + bias`` in fp32.

torch's int8 CPU kernel (``aten._weight_int8pack_mm``) takes bf16 activations only (its fp32 path is a scalar loop);
an int8 model then computes in bf16, whose elementwise ops this kind of CPU emulates, and whose attention cannot take
the C decode tile (``engine.kv.kernels``) without leaving stock transformers' tokens. Here:

- decode steps (at most ``GEMV_ROWS`` rows): ``int8_gemv.c``, built once per machine like the host attention tile,
  reads each weight's int8 code once and sums in fp32; output rows split over the library's own spinning pthreads
  (``engine/native/split_pool.h``) when torch may use several threads;
- longer inputs (prefill chunks): the layer's weight dequantized to fp32 for the call and multiplied by torch's
  fp32 matmul, whose blocked kernels do that better. Both give the products of the same fp32 numbers.

``kernel()`` is None where no C compiler is found, or where the built GEMV failed its probe: then int8 models compute
in bf16 (``quantize_int8``).

bf16 activations (``int8_linear_bf16``) take torch's kernel only where it passed its probe on this CPU and torch
(``crash_probe``: once in a child process, remembered on disk): its AVX-512 path of torch 2.13 segfaults for 4 or more
rows when the codes do not start on a 32-byte boundary, as the weights cache's memory-mapped codes do. Elsewhere
they run here: decode rows widened to fp32 through the GEMV (rounded once to bf16), prefill chunks through stock's
bf16 matmul of the dequantized weight.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..native import crash_probe
from ..native import library as native
from . import cpu_matmul

logger = logging.getLogger(__name__)

GEMV_ROWS = 16  # rows from which the dequantize-and-matmul path is faster (prefill chunks)
_SPLIT_BYTES = 1 << 20  # layers with fewer weight bytes run on the calling thread: a hand-off costs more than it saves
_SOURCE = Path(__file__).with_name("int8_gemv.c")
_P, _L = ctypes.c_void_p, ctypes.c_long
_ARGTYPES = [_P, _P, _P, _P, _P, _L, _L, _L, _L, _L]  # x, codes, scales, bias, y, rows, in, out, lo, hi


class Functions(NamedTuple):
    """A build of ``int8_gemv.c``: the GEMV of a row range, and of every row split over the caller and the
    library's own spinning pool (``engine/native/split_pool.h``), with the pool's idle spin (set, returns the
    previous: ns) and the count of tasks its workers ran."""

    gemv: ctypes._CFuncPtr
    gemv_split: ctypes._CFuncPtr
    split_spin_ns: ctypes._CFuncPtr
    split_worker_tasks: ctypes._CFuncPtr


@functools.cache
def kernel() -> Functions | None:
    """The C ``Functions``, or None (no compiler, the build failed, or it failed its probe: logged)."""
    functions = _built_kernel()
    if functions is None:
        return None
    key = (native.source_digest(_SOURCE), native.target_arch())
    if not crash_probe.survives("int8-gemv", f"{__name__}:exercise_gemv", key):
        return None
    return functions


@functools.cache
def _built_kernel() -> Functions | None:
    """The ``Functions`` as built, not yet probed (what the probe's child calls)."""
    compiler = native.compiler()
    if compiler is None:
        logger.info("int8 weights: no C compiler found; int8 models compute in bf16")
        return None
    library = native.load_library(compiler, _SOURCE, [[]])
    if library is None:
        return None
    gemv, gemv_split = library.int8_gemv, library.int8_gemv_split
    gemv.argtypes, gemv.restype = _ARGTYPES, ctypes.c_int
    gemv_split.argtypes, gemv_split.restype = [*_ARGTYPES[:8], ctypes.c_int], ctypes.c_int
    spin, tasks = library.int8_split_spin_ns, library.int8_split_worker_tasks
    spin.argtypes, spin.restype, tasks.argtypes, tasks.restype = [_L], _L, [], _L
    return Functions(gemv, gemv_split, spin, tasks)


@functools.cache
def torch_kernel_is_safe() -> bool:
    """Whether torch's ``_weight_int8pack_mm`` ran cleanly and right in a child process, on this CPU, this torch
    and the vector width torch picked (``ATEN_CPU_CAPABILITY`` can lower it)."""
    key = (torch.__version__, torch.backends.cpu.get_cpu_capability())
    return crash_probe.survives("torch-int8pack-mm", TORCH_PROBE, key)


TORCH_PROBE = f"{__name__}:exercise_torch_kernel"  # a name, so that a test can aim the probe at a crash


def int8_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x: [..., in] fp32; codes: [out, in] int8; scales: [out] fp32; bias: [out] fp32 or None. Returns [..., out]."""
    out_features, in_features = codes.shape
    rows = x.numel() // in_features
    functions = kernel()
    if rows > GEMV_ROWS or functions is None or in_features % 8:
        weight = codes.to(torch.float32).mul_(scales[:, None])  # exact: the scales are powers of two
        return cpu_matmul.linear(x, weight, bias)
    flat = x.contiguous()  # [..., in] read as [M, in]
    y = torch.empty(*x.shape[:-1], out_features)  # [..., out] written as [M, out]
    args = (flat.data_ptr(), codes.data_ptr(), scales.data_ptr(), 0 if bias is None else bias.data_ptr(),
            y.data_ptr(), rows, in_features, out_features)
    threads = split_threads(codes.numel())
    _check(functions.gemv(*args, 0, out_features) if threads == 1 else functions.gemv_split(*args, threads))
    return y


def int8_linear_bf16(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                     bias: torch.Tensor | None) -> torch.Tensor:
    """x: [..., in] bf16; codes: [out, in] int8; scales: [out] bf16; bias: [out] bf16 or None. Returns [..., out]
    bf16: torch's kernel where its probe passed, else for decode rows the C GEMV on the fp32 widening (exact
    products, fp32 sums, one rounding to bf16) and for longer inputs torch's bf16 matmul of the dequantized weight."""
    out_features, in_features = codes.shape
    if torch_kernel_is_safe():
        # torch's kernel wants contiguous 2-D activations in the scales' dtype (bf16).
        out = torch._weight_int8pack_mm(x.reshape(-1, in_features).contiguous(), codes, scales)  # [M, out]
        if bias is not None:
            out = out + bias
        return out.reshape(*x.shape[:-1], out_features)
    if x.numel() // in_features > GEMV_ROWS or kernel() is None:
        # Prefill chunks: stock's own bf16 matmul on the dequantized weight, so that the prompt's keys and values
        # are stock's to the bit (an fp32 product rounded once differs from it by bf16 rounding, which decode
        # steps then carry).
        weight = codes.to(torch.bfloat16).mul_(scales[:, None])  # exact: the scales are powers of two
        return F.linear(x, weight, bias)
    out = int8_linear(x.float(), codes, scales.float(), None if bias is None else bias.float())
    return out.to(torch.bfloat16)


def split_threads(weight_bytes: int, split_bytes: int | None = None) -> int:
    """How many threads a layer's rows run on: 1 for fewer than 2 ``split_bytes`` weight bytes (a hand-off would
    cost more than it saves), else one per ``split_bytes``, at most torch's thread count. ``split_bytes``: default
    ``_SPLIT_BYTES``."""
    split_bytes = _SPLIT_BYTES if split_bytes is None else split_bytes
    return 1 if weight_bytes < 2 * split_bytes else min(torch.get_num_threads(), weight_bytes // split_bytes)


def _check(status: int) -> None:
    assert status == 0, "int8_gemv: the input width must be a multiple of 8"


def exercise_gemv() -> None:
    """The int8-gemv probe (run in a child process): the built GEMV on decode rows of a few widths, checked."""
    functions = _built_kernel()
    for rows, out_features, in_features in ((1, 40, 64), (3, 41, 576), (GEMV_ROWS, 1537, 576)):
        codes, scales, bias, x = _probe_case(rows, out_features, in_features, torch.float32)
        y = torch.empty(rows, out_features)
        args = (x.data_ptr(), codes.data_ptr(), scales.data_ptr(), bias.data_ptr(), y.data_ptr(), rows, in_features,
                out_features)
        _check(functions.gemv(*args, 0, out_features))
        _assert_close(y, x, codes, scales, bias)
        whole = y.clone()
        for threads in (3, 2):  # the pool's first start, then a call taking fewer of its workers
            _check(functions.gemv_split(*args, threads))
            if not torch.equal(y, whole):
                raise SystemExit(f"int8 GEMV split over {threads} threads differs from one thread")


def exercise_torch_kernel() -> None:
    """The torch-int8pack-mm probe (run in a child process): torch's kernel on every row count's path and on codes
    at several offsets from a 64-byte boundary (memory-mapped codes start anywhere), checked."""
    for rows in (1, 2, 4, 16, 17, 64):
        for offset in (0, 1, 8, 32):
            for out_features, in_features in ((40, 64), (1537, 576)):
                codes, scales, bias, x = _probe_case(rows, out_features, in_features, torch.bfloat16, offset)
                y = torch._weight_int8pack_mm(x, codes, scales)
                _assert_close(y.float(), x, codes, scales, None)


def _probe_case(rows: int, out_features: int, in_features: int, dtype: torch.dtype, offset: int = 0):
    """(codes [out, in] starting ``offset`` bytes past a 64-byte boundary, scales [out], bias [out], x [rows, in])."""
    generator = torch.Generator().manual_seed(rows * 7 + offset)
    storage = torch.randint(-127, 128, (out_features * in_features + 128,), dtype=torch.int8, generator=generator)
    start = (-storage.data_ptr()) % 64 + offset
    codes = storage[start : start + out_features * in_features].view(out_features, in_features)
    scales = torch.exp2(torch.randint(-8, 0, (out_features,), generator=generator).float()).to(dtype)
    bias = torch.randn(out_features, generator=generator).to(dtype)
    return codes, scales, bias, torch.randn(rows, in_features, generator=generator).to(dtype)


def _assert_close(y: torch.Tensor, x, codes, scales, bias) -> None:
    expected = x.double() @ (codes.double() * scales.double()[:, None]).T
    expected = expected if bias is None else expected + bias.double()
    error = float((y.double() - expected).abs().max() / expected.abs().max())
    if not error < 1e-2:  # bf16 rounding is 4e-3; a wrong kernel is off by far more
        raise SystemExit(f"int8 product off by {error:.3g} of its largest value")
