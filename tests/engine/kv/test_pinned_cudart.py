"""The libcudart whose last error a refused registration clears is the one torch loaded, not the first mapped.

Two fake runtimes (tiny C libraries exporting ``cudaGetLastError``): one another package mapped first, one a fake
"torch" library links. Needs a C compiler; skipped where a real CUDA runtime sits in the global scope.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from engine.kv import pinned

COMPILER = shutil.which("cc") or shutil.which("gcc")


def _global_runtime() -> bool:
    return hasattr(ctypes.CDLL(None), "cudaGetLastError")


pytestmark = [pytest.mark.skipif(COMPILER is None, reason="needs a C compiler"),
              pytest.mark.skipif(_global_runtime(), reason="a real CUDA runtime is in the global scope")]


def _shared(folder, name: str, source: str, *link: str):
    (folder / f"{name}.c").write_text(source)
    target = folder / name
    subprocess.run([COMPILER, "-shared", "-fPIC", f"-Wl,-soname,{name}", "-o", str(target),
                    str(folder / f"{name}.c"), *link], check=True, capture_output=True)
    return target


def _runtime(folder, soname: str, which: int):
    folder.mkdir()
    return _shared(folder, soname, f"int cudaGetLastError(void) {{ return {which}; }}\n"
                                   f'const char *cudaGetErrorString(int code) {{ return "runtime {which}"; }}\n')


def test_the_runtime_torch_links_is_chosen_over_an_earlier_mapped_one(tmp_path):
    other = _runtime(tmp_path / "a-other-package", "libcudart.so.11", 1)  # sorts first in /proc/self/maps
    torchs = _runtime(tmp_path / "b-torch-wheel", "libcudart.so.12", 2)
    fake_torch = _shared(tmp_path, "libfaketorch.so", "int cudaGetLastError(void);\n"
                                                      "int torch_check(void) { return cudaGetLastError(); }\n",
                         str(torchs), f"-Wl,-rpath,{torchs.parent}")
    ctypes.CDLL(str(other))  # mapped first, locally, as another package would
    ctypes.CDLL(str(fake_torch))  # loads its libcudart.so.12 through its rpath
    handle = pinned._loaded_cudart(torch_library=str(fake_torch))
    assert handle is not None and handle.cudaGetLastError() == 2


def test_no_runtime_anywhere_gives_no_handle(tmp_path):
    plain = _shared(tmp_path, "libplain.so", "int nothing(void) { return 0; }\n")
    ctypes.CDLL(str(plain))
    assert pinned._loaded_cudart(torch_library=str(plain)) is None
