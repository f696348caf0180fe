"""Native kernels are loaded only as this studio built them (``engine.native.trusted``): a library planted under a
kernel's computed name in the kernel folder is never loaded (its constructor never runs), it is rebuilt, and the real
kernel then works; a kernel folder other users may write is not used."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess

import pytest
import torch

from engine.kv import native as host_kernel
from engine.cpu import int8_matmul
from engine.native import crash_probe, library, trusted

COMPILER = library.compiler()
needs_compiler = pytest.mark.skipif(COMPILER is None or shutil.which(COMPILER) is None, reason="no C compiler")

# A library whose constructor leaves a file behind: what an attacker's planted kernel would run on load.
PLANTED_C = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *marker = fopen(MARKER, "w");
    if (marker) { fputs("the planted constructor ran", marker); fclose(marker); }
}
int int8_gemv(void) { return 12345; }
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("HEADINFER_CACHE", str(folder))
    monkeypatch.delenv(trusted.PRIVATE_FOLDER_ENV, raising=False)
    return folder


def _planted_library(path, marker) -> bytes:
    """Builds the marker library at ``path`` with the system's compiler; returns its bytes."""
    source = path.with_suffix(".c")
    source.write_text(PLANTED_C)
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([COMPILER, "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(path), str(source)], check=True)
    source.unlink()
    return path.read_bytes()


def _int8_gemv_works(functions) -> bool:
    """One 3 x 16 int8 GEMV through the loaded library, against float64."""
    torch.manual_seed(0)
    x = torch.randn(1, 16)
    codes = torch.randint(-127, 128, (3, 16), dtype=torch.int8)
    scales = torch.tensor([0.5, 0.25, 2.0])
    y = torch.empty(1, 3)
    status = functions.gemv(x.data_ptr(), codes.data_ptr(), scales.data_ptr(), 0, y.data_ptr(), 1, 16, 3, 0, 3)
    expected = x.double() @ (codes.double() * scales.double()[:, None]).T
    return status == 0 and torch.allclose(y.double(), expected, atol=1e-4)


def _fresh_int8_build():
    int8_matmul._built_kernel.cache_clear()
    try:
        return int8_matmul._built_kernel()
    finally:
        int8_matmul._built_kernel.cache_clear()  # later tests build theirs in their own cache


@needs_compiler
@pytest.mark.parametrize("record", ["none", "forged", "garbage"])
def test_a_library_planted_under_the_kernels_name_is_rebuilt_and_never_loaded(cache, tmp_path, record, caplog):
    name = library.library_name(COMPILER, [], int8_matmul._SOURCE)
    target = trusted.kernel_folder() / name
    marker = tmp_path / "constructor-ran"
    planted = _planted_library(target, marker)
    if record == "forged":  # a record of another library's hash: the planted bytes do not match it
        trusted._write_record(target, "0" * 64, len(planted))
    elif record == "garbage":
        trusted.record_path(target).write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="engine.native.trusted"):
        functions = _fresh_int8_build()
    assert not marker.exists(), "the planted library was loaded: its constructor ran"
    assert functions is not None and _int8_gemv_works(functions)
    rebuilt = target.read_bytes()
    assert rebuilt != planted
    assert trusted._matches_record(target)  # the rebuild recorded its own hash
    assert any("not loaded; building it again" in r.getMessage() for r in caplog.records)


@needs_compiler
def test_a_built_library_whose_bytes_changed_is_rebuilt(cache, tmp_path):
    first = _fresh_int8_build()
    assert first is not None
    name = library.library_name(COMPILER, [], int8_matmul._SOURCE)
    target = trusted.kernel_folder() / name
    genuine = target.read_bytes()
    # Replaced on disk (a new inode, so this process's mapping of the genuine one stays valid): cut short ...
    target.unlink()
    target.write_bytes(genuine[: len(genuine) // 2])
    assert not trusted._matches_record(target)
    trusted.load(name, lambda out: out.write_bytes(genuine))  # ... then rebuilt, not loaded as it was
    assert target.read_bytes() == genuine and trusted._matches_record(target)


def test_a_verified_library_is_loaded_without_building(cache, tmp_path):
    built = []

    def build(out):
        built.append(out)
        _planted_library(out, tmp_path / "ran")  # any library: this one is "ours"

    if COMPILER is None or shutil.which(COMPILER) is None:
        pytest.skip("no C compiler")
    trusted.load("ours-0001.so", build)
    trusted.load("ours-0001.so", build)
    assert len(built) == 1  # the second load found its record and the bytes matching it


@pytest.mark.skipif(os.name == "nt", reason="no file modes on Windows (see engine/native/trusted.py)")
def test_a_kernel_folder_other_users_may_write_is_not_used(cache, tmp_path, caplog):
    shared = cache / "kernels"
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="engine.native.trusted"):
        folder = trusted.kernel_folder()
    assert folder != shared and folder.is_dir()
    mode = folder.stat()
    assert mode.st_uid == os.getuid() and stat.S_IMODE(mode.st_mode) == 0o700
    assert any("writable by other users" in r.getMessage() for r in caplog.records)
    assert trusted.kernel_folder() == folder  # one private folder for the run
    assert trusted.child_env() == {trusted.PRIVATE_FOLDER_ENV: str(folder)}  # the probes' children use it too
    assert crash_probe._record_path("x", "m:f", ()).parent == folder / "probes"


@pytest.mark.skipif(os.name == "nt" or os.getuid() != 0, reason="needs root to give a folder to another user")
def test_a_kernel_folder_of_another_user_is_not_used(cache):
    other = cache / "kernels"
    other.mkdir(parents=True, mode=0o700)
    os.chown(other, 65534, 65534)  # nobody
    assert "owned by another user" in trusted.unsafe_reason(other)
    assert trusted.kernel_folder() != other


def test_a_new_kernel_folder_is_private(cache):
    folder = trusted.kernel_folder()
    assert folder == cache / "kernels"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 or os.name == "nt"
    assert trusted.child_env() == {}


@needs_compiler
def test_a_build_that_fails_leaves_no_library_and_the_caller_falls_back(cache, monkeypatch):
    monkeypatch.setattr(library, "target_arch", lambda: "no-such-cpu")  # the compiler refuses the flag
    assert library.load_library(COMPILER, int8_matmul._SOURCE, [[]]) is None
    assert not list(trusted.kernel_folder().glob("*.so"))


@pytest.mark.slow  # builds the host attention kernel's four vector paths: minutes on a small machine
@needs_compiler
def test_a_host_kernel_planted_under_its_name_is_rebuilt_and_never_loaded(cache, tmp_path):
    name = host_kernel.host_library_name(COMPILER, [])
    target = trusted.kernel_folder() / name
    marker = tmp_path / "constructor-ran"
    planted = _planted_library(target, marker)
    function = host_kernel.build(COMPILER)
    assert not marker.exists() and target.read_bytes() != planted
    assert function is not None and function.variant(host_kernel.PATHS["portable"]) == host_kernel.PATHS["portable"]
    query = torch.randn(1, 2, 1, 64)
    block = torch.randn(5, 1, 2, 1, 64)  # [n, B, 2, g, D]
    out = torch.empty_like(query)
    host_kernel.attend_layer(query, [block], 0, 5, out, scaling=0.125, function=function)
    weights = torch.einsum("hd,nd->hn", query[0, :, 0].double(), block[:, 0, 0, 0].double()).mul(0.125).softmax(-1)
    expected = torch.einsum("hn,nd->hd", weights, block[:, 0, 1, 0].double())
    assert torch.allclose(out[0, :, 0].double(), expected, atol=1e-4)
