"""The C host tile builds without _Float16 (GCC < 12) and widens fp16 exactly as with it."""

from __future__ import annotations

import shutil

import pytest
import torch

from engine.kv import native

COMPILER = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(COMPILER is None, reason="needs a C compiler")


def _widened_by(tile_function, values: torch.Tensor) -> torch.Tensor:
    """values [group, dim] fp16 as the tile widens them: one visible key of score 0 gives acc = 1.0 * value."""
    group, dim = values.shape
    block = torch.zeros(1, 1, 2, group, dim, dtype=torch.float16)  # [n, B, 2, g, D]: keys 0, values below
    block[0, 0, 1] = values
    query = torch.zeros(group, 1, dim)  # [heads, rows, D]
    m, l, acc = torch.empty(group), torch.empty(group), torch.empty(group, dim)
    status = tile_function(block.data_ptr(), native.DTYPE_CODES["torch.float16"], 2, 1, 1, group, dim,
                           query.data_ptr(), 1, 1, 0, 0, 0, 0.0, m.data_ptr(), l.data_ptr(), acc.data_ptr())
    assert status == 0 and torch.equal(l, torch.ones(group))
    return acc


# A compiler without _Float16 (GCC 11 on x86): it does not announce the type, and any use of it fails to build.
LIKE_GCC_11 = ["-U__FLT16_MAX__", "-D_Float16=no_Float16_in_this_compiler"]


def test_a_compiler_without_float16_builds_the_tile_and_every_fp16_value_widens_exactly():
    no_float16 = native.build(COMPILER, [[*LIKE_GCC_11, "-DHEADINFER_NO_LIBMVEC", "-lm"]])
    assert no_float16 is not None, "the C tile must build without _Float16"
    every_half = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16)
    values = every_half.view(256, 256)  # zeros, subnormals, normals, infinities and NaNs of both signs
    widened = _widened_by(no_float16, values)
    expected = values.float() + 0.0  # the tile accumulates onto +0: -0 comes back +0
    assert torch.equal(widened.isnan(), expected.isnan())
    finite = ~expected.isnan()
    assert torch.equal(widened[finite].view(torch.int32), expected[finite].view(torch.int32))  # bit for bit


def test_the_variants_with_and_without_float16_compute_the_same_tile():
    torch.manual_seed(0)
    n, group, dim, rows = 37, 2, 64, 3
    block = torch.randn(n, 1, 2, group, dim).to(torch.float16)
    query = torch.randn(group, rows, dim)
    outputs = []
    for variant in ([], [native._NO_FLOAT16]):
        function = native.build(COMPILER, [[*variant, "-DHEADINFER_NO_LIBMVEC", "-lm"]])
        m, l, acc = torch.empty(group * rows), torch.empty(group * rows), torch.empty(group * rows, dim)
        assert function(block.data_ptr(), 2, 2, n, 1, group, dim, query.data_ptr(), rows, rows, 0, n - rows, 0,
                        0.0, m.data_ptr(), l.data_ptr(), acc.data_ptr()) == 0
        outputs.append((m, l, acc))
    for with_float16, without in zip(*outputs):
        assert torch.equal(with_float16, without)
