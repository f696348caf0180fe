"""The fp32 matmul of a prefill chunk on the CPU: oneDNN's, where this torch ships it and it runs cleanly here.

Why not ``F.linear``: torch sends an fp32 ``linear`` on the CPU to MKL, and MKL picks its vector code by the CPU's
vendor, not by what the CPU can do: on an AMD EPYC with AVX-512 its sgemm ran at 104-112 GFLOPS on one core where
oneDNN's (the same torch build's other library, which dispatches on the instruction set) ran at 227-242, and
182 against 420-480 on two (``benchmarks/cpu/cpu_matmul.py``). A prefill chunk of the CPU default model spends
most of its time in these products, the weights dequantized from their GGUF blocks.

The product is the same fp32 product: oneDNN sums in fp32 in its own order, as MKL does in its own, so the results
differ by fp32 rounding only (the parity tests hold both to stock transformers). oneDNN is used only under
``torch.get_float32_matmul_precision() == "highest"`` (where it could otherwise use reduced-precision arithmetic)
and only after ``exercise_onednn`` ran cleanly in a child process on this CPU and torch (``native.crash_probe``):
the op is torch's private one, its code chosen at run time by the CPU. Anywhere else it is ``F.linear``.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

from ..native import crash_probe

logger = logging.getLogger(__name__)

PROBE = f"{__name__}:exercise_onednn"  # a name, so that a test can aim the probe at a crash
_forced: list[bool] = []  # a test's choice: [True] oneDNN, [False] F.linear, [] the machine's


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: [..., in] fp32; weight: [out, in] fp32; bias: [out] fp32 or None. Returns [..., out] fp32, ``F.linear``'s
    product to fp32 rounding."""
    if (x.dtype == weight.dtype == torch.float32 and (bias is None or bias.dtype == torch.float32)
            and x.device.type == "cpu" and not (x.requires_grad or weight.requires_grad)  # oneDNN's op: no backward
            and torch.get_float32_matmul_precision() == "highest" and uses_onednn()):
        return _onednn(x, weight, bias)
    return F.linear(x, weight, bias)


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # oneDNN's kernel reads plain contiguous rows; a transposed or sliced view is copied once here.
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight.contiguous(), bias, "none", [], "")


def uses_onednn() -> bool:
    """Whether ``linear`` goes to oneDNN on this machine (a test may force either answer with ``force``)."""
    return _forced[0] if _forced else _onednn_is_safe()


def force(onednn: bool | None) -> None:
    """Makes ``linear`` take oneDNN (True) or ``F.linear`` (False) whatever the machine; None: the machine's."""
    _forced.clear()
    if onednn is not None:
        _forced.append(onednn)


def available() -> bool:
    """Whether this torch ships oneDNN's linear op at all (whether it runs cleanly here is ``uses_onednn``)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache
def _onednn_is_safe() -> bool:
    if not available():
        logger.info("CPU matmul: this torch has no oneDNN linear; prefill products take torch's default (MKL)")
        return False
    key = (torch.__version__, torch.backends.cpu.get_cpu_capability())
    safe = crash_probe.survives("torch-onednn-linear", PROBE, key)
    logger.info("CPU matmul: prefill products take %s", "oneDNN" if safe else "torch's default (oneDNN's probe failed)")
    return safe


def exercise_onednn() -> None:
    """The probe's child: oneDNN's product on the shapes a prefill sends it (2-D and 3-D, with and without a bias,
    a row count that is not a multiple of any vector width) against float64, exiting non-zero on a wrong result."""
    generator = torch.Generator().manual_seed(0)
    for rows, inputs, outputs, with_bias in ((1, 64, 32, False), (37, 96, 80, True), (512, 256, 160, False)):
        x = torch.randn(1, rows, inputs, generator=generator)
        weight = torch.randn(outputs, inputs, generator=generator)
        bias = torch.randn(outputs, generator=generator) if with_bias else None
        got = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        want = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
        if got.shape != want.shape or not torch.allclose(got.double(), want, rtol=1e-4, atol=1e-4):
            raise SystemExit(f"oneDNN linear: wrong result for {rows}x{inputs}x{outputs}")
