"""MSVC's ``cl`` builds the C kernels on Windows where it is on PATH (issue 50, item 4), in the Windows-shaped mode here:
a stand-in ``cl`` records its command line and builds what it is told with gcc (its flags translated back), so the
choice, the command, the ``.dll`` name, the load and the kernel's results are this machine's; a ``cl`` that refuses
the build leaves the torch paths and one log line that says why. That a real ``cl`` builds these sources only a
Windows PC can show (docs/windows.md)."""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
from pathlib import Path

import pytest

from engine import paths_windows
from engine.cpu import int8_matmul
from engine.native import library, trusted

# Fails as told (FAKE_CL_FAILS, with MSVC's message for a missing header), else builds with gcc.
FAKE_CL = """#!{python}
import json, os, subprocess, sys
args = sys.argv[1:]
with open(os.environ["FAKE_CL_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if not args:  # what library_name runs for the version: cl's banner, on stderr
    print("Microsoft (R) C/C++ Optimizing Compiler Version 19.40.33811 for x64", file=sys.stderr)
    sys.exit(0)
if os.environ.get("FAKE_CL_FAILS"):
    print("int8_gemv.c\\nsplit_pool.h(12): fatal error C1083: Cannot open include file: 'pthread.h': No such file")
    sys.exit(2)
arch = {{"/arch:AVX2": ["-mavx2", "-mfma", "-mf16c"], "/arch:AVX512": ["-march=x86-64-v4"]}}
gcc = ["gcc", "-shared", "-fPIC", "-pthread"]
for arg in args:
    if arg.endswith(".c"):  # (a POSIX path starts with the slash MSVC's options do)
        gcc.append(arg)
    elif arg.startswith("/D"):
        gcc.append("-D" + arg[2:])
    elif arg.startswith("/Fe"):
        gcc += ["-o", arg[3:]]
    elif arg.startswith("/"):
        gcc += {{"/O2": ["-O2"], "/openmp:experimental": ["-fopenmp-simd"]}}.get(arg, arch.get(arg, []))
    else:
        gcc.append(arg)
sys.exit(subprocess.run(gcc).returncode)
"""


@pytest.fixture
def fake_cl(tmp_path, tmp_path_factory, monkeypatch):
    """A Windows-shaped process with the stand-in ``cl`` first on PATH and a kernel folder of its own (short enough
    for Windows' path limit: ``paths_windows.windows_path``); yields the file its command lines are recorded in (one
    JSON list a line)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    cl = folder / "cl"
    cl.write_text(FAKE_CL.format(python=sys.executable))
    cl.chmod(cl.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "cl.log"
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_CL_LOG", str(log))
    monkeypatch.setenv("HEADINFER_CACHE", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.setenv(paths_windows.ENV, "1")
    for cached in (int8_matmul._built_kernel, int8_matmul.kernel):
        cached.cache_clear()
    yield log
    for cached in (int8_matmul._built_kernel, int8_matmul.kernel):
        cached.cache_clear()  # the next test builds (or not) as its own settings say


def _builds(log: Path) -> list[list[str]]:
    return [args for args in map(json.loads, log.read_text().splitlines()) if args]


def _cl_path(log: Path) -> str:
    return str(log.parent / "bin" / "cl")


def _cpu_arch() -> list[str]:
    flags = set(library.cpu_identity().split())
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        return ["/arch:AVX512"]
    return ["/arch:AVX2"] if {"avx2", "fma"} <= flags else []


def test_windows_takes_cl_from_path_and_builds_a_dll_that_loads_and_computes_right(fake_cl):
    assert library.compiler() == _cl_path(fake_cl)
    int8_matmul.exercise_gemv()  # built by cl, loaded, its rows checked against torch (raises if wrong)
    [build] = _builds(fake_cl)
    source = str(Path(int8_matmul.__file__).with_name("int8_gemv.c"))
    assert build[:5] == ["/nologo", "/O2", "/LD", "/openmp:experimental", "/fp:precise"]  # (cl's arguments)
    assert build[5:-3] == _cpu_arch() and build[-3] == source
    assert build[-2].startswith("/Fo") and build[-2].endswith(os.sep) and build[-1].startswith("/Fe")
    [dll] = trusted.kernel_folder().glob("int8_gemv-*.dll")
    assert Path(build[-1][3:]).name == dll.name and trusted.record_path(dll).exists()
    int8_matmul._built_kernel.cache_clear()
    int8_matmul.exercise_gemv()  # a second start loads the recorded DLL: no build
    assert len(_builds(fake_cl)) == 1


@pytest.mark.parametrize(("arch", "flags"), [("x86-64-v3", ["/arch:AVX2"]), ("x86-64-v4", ["/arch:AVX512"]),
                                             ("x86-64", [])])
def test_the_gcc_flags_become_msvcs(arch, flags, monkeypatch, tmp_path):
    monkeypatch.setenv("HEADINFER_NATIVE_ARCH", arch)
    output = tmp_path / "gguf_gemv-0.dll"
    command = library.msvc_command("cl.exe", ["-ffp-contract=off", "-DHEADINFER_GGUF_VNNI"], Path("gguf_gemv.c"),
                                   output)
    assert command == ["cl.exe", "/nologo", "/O2", "/LD", "/openmp:experimental", "/fp:precise", *flags,
                       "/DHEADINFER_GGUF_VNNI", "gguf_gemv.c", f"/Fo{tmp_path}{os.sep}", f"/Fe{output}"]
    assert library.is_msvc("C:\\VS\\bin\\cl.exe") and not library.is_msvc("/usr/bin/clang")


def test_a_cl_that_refuses_the_build_leaves_the_torch_paths_and_one_line_saying_why(fake_cl, monkeypatch, caplog):
    monkeypatch.setenv("FAKE_CL_FAILS", "1")
    with caplog.at_level(logging.INFO):
        assert int8_matmul._built_kernel() is None
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in said] == [
        "C kernels: MSVC's cl did not build int8_gemv.c (split_pool.h(12): fatal error C1083: Cannot open include "
        "file: 'pthread.h': No such file); the torch paths run instead (docs/windows.md)"]
    assert not list(trusted.kernel_folder().glob("int8_gemv-*"))
    assert int8_matmul.kernel() is None  # int8 weights compute through torch (``int8_linear``'s other path)
