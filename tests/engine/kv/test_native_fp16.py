"""The C host attention kernel builds without _Float16 (GCC < 12) and widens and rounds fp16 exactly as with it."""

from __future__ import annotations

import shutil

import pytest
import torch

from engine.kv import native

COMPILER = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(COMPILER is None, reason="needs a C compiler")

# A compiler without _Float16 (GCC 11 on x86): it does not announce the type, and any use of it fails to build.
LIKE_GCC_11 = ["-U__FLT16_MAX__", "-D_Float16=no_Float16_in_this_compiler"]


@pytest.fixture(autouse=True)
def portable_path(monkeypatch):
    """The portable path: the one that widens fp16 with _Float16 or with bit operations (the vector paths use F16C)."""
    monkeypatch.setenv(native.ENV_PATH, "portable")


def _widened_by(function, values: torch.Tensor) -> torch.Tensor:
    """values [group, dim] fp16 as the kernel widens them: one visible key of score 0 gives out = 1.0 * value."""
    group, dim = values.shape
    block = torch.zeros(1, 1, 2, group, dim, dtype=torch.float16)  # [n, B, 2, g, D]: keys 0, values below
    block[0, 0, 1] = values
    query = torch.zeros(1, group, 1, dim)  # [B, H, Q, D] fp32: the output comes back in fp32, unrounded
    out = torch.empty_like(query)
    native.attend_layer(query, [block], 0, 1, out, scaling=1.0, function=function)
    return out[0, :, 0]


def test_a_compiler_without_float16_builds_the_kernel_and_every_fp16_value_widens_exactly():
    no_float16 = native.build(COMPILER, LIKE_GCC_11)
    assert no_float16 is not None, "the C kernel must build without _Float16"
    every_half = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16)
    values = every_half.view(256, 256)  # zeros, subnormals, normals, infinities and NaNs of both signs
    widened = _widened_by(no_float16, values)
    expected = values.float() + 0.0  # the kernel accumulates onto +0: -0 comes back +0
    assert torch.equal(widened.isnan(), expected.isnan())
    finite = ~expected.isnan()
    assert torch.equal(widened[finite].view(torch.int32), expected[finite].view(torch.int32))  # bit for bit


def test_the_builds_with_and_without_float16_compute_and_round_the_same():
    torch.manual_seed(0)
    n, group, dim, n_rep, q_len = 37, 2, 64, 3, 2
    block = torch.randn(n, 1, 2, group, dim).to(torch.float16)
    query = torch.randn(1, group * n_rep, q_len, dim).to(torch.float16)
    outputs = []
    for extra in ([], LIKE_GCC_11):
        out = torch.empty_like(query)  # fp16: rounded by _Float16's cast, or by bit operations
        native.attend_layer(query, [block], 0, n, out, scaling=0.125, function=native.build(COMPILER, extra))
        outputs.append(out)
    assert torch.equal(outputs[0].view(torch.int16), outputs[1].view(torch.int16))
