"""Building C code for this machine: the compiler, and ``load_library``, which compiles a source once per machine
into the studio's kernel folder and loads it (``trusted``: only as built). The weights' kernels
(``cpu/int8_matmul.py``, ``cpu/gguf_blocks.py``) are built here; the KV's host attention kernel
(``kv/native.py``) takes the compiler from here and links its own vector paths. The ground floor: it imports only
``paths``, ``paths_windows`` (and ``trusted``, which imports only ``paths``), so ``kv/`` and ``cpu/`` both stand
on it.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

from ..paths_windows import windows_rules, windows_shaped
from . import trusted
from .trusted import kernel_folder

logger = logging.getLogger(__name__)

_FLAGS = ["-O3", "-fopenmp-simd", "-fno-math-errno", "-shared", "-fPIC", "-pthread"]  # load_library's (plus -march)
_LOCAL_INCLUDE = re.compile(rb'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def load_library(compiler: str, source: Path, variants: list[list[str]]) -> ctypes.CDLL | None:
    """``source`` compiled once per machine into the kernel folder (``-O3 -march=native`` plus the first of
    ``variants`` that builds) and loaded, only as the build recorded it (``trusted.load``: a library planted under
    its name is rebuilt, never loaded); None if every variant fails (logged)."""
    errors = []
    for variant in variants:
        try:
            return _built(compiler, variant, source)
        except (OSError, subprocess.SubprocessError) as error:
            errors.append(str(error))
    logger.warning("building %s failed: %s", source.name, errors[-1] if errors else "no variants")
    return None


def _built(compiler: str, variant: list[str], source: Path) -> ctypes.CDLL:
    name = library_name(compiler, variant, source)
    variant = [f"-march={target_arch()}", *variant]

    def build(output: Path) -> None:
        done = subprocess.run([compiler, *_FLAGS, "-o", str(output), str(source), *variant], capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0:
            raise OSError(done.stderr.strip()[-500:])
        logger.info("built %s into %s", source.name, kernel_folder() / output.name)

    return trusted.load(name, build)


def library_name(compiler: str, variant: list[str], source: Path) -> str:
    """The file name of ``source``'s build with ``variant`` (and ``target_arch``): a hash of what it is built from."""
    variant = [f"-march={target_arch()}", *variant]
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    digest = hashlib.sha256(b"\0".join([source_bytes(source), version.encode(), " ".join(_FLAGS + variant).encode(),
                                        cpu_identity().encode()])).hexdigest()[:16]
    return f"{source.stem}-{digest}.so"


def source_bytes(source: Path) -> bytes:
    """``source`` and the files its ``#include "..."`` lines name (each relative to the file naming it), theirs in
    turn, each once: what a build is of, so that a change to a shared header (``split_pool.h``, ``common.h``, which
    split_pool.h includes) rebuilds and re-probes every library that includes it."""
    seen: list[Path] = []

    def add(path: Path) -> None:
        if path in seen:
            return
        seen.append(path)
        for name in _LOCAL_INCLUDE.findall(path.read_bytes()):
            add((path.parent / name.decode()).resolve())

    add(source.resolve())
    return b"\0".join(path.read_bytes() for path in seen)


def source_digest(source: Path) -> str:
    """sha256 of ``source_bytes(source)``: the crash probes' key for a build of it."""
    return hashlib.sha256(source_bytes(source)).hexdigest()


def compiler() -> str | None:
    """The C compiler the kernels are built with (``$CC``, else ``cc``/``gcc``), or None (the torch paths).

    None under Windows' rules (``engine.paths_windows``): the builds take GCC/Clang flags, pthreads and ``.so``
    names, and MSVC's ``cl`` takes none of them, so a Windows PC runs the torch paths (logged once)."""
    if windows_rules():
        _say_no_compiler()
        return None
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@functools.cache
def _say_no_compiler() -> None:
    logger.info("C kernels not built: %s; the torch paths run instead (slower on the CPU, the same results)",
                "Windows-shaped run (HEADINFER_WINDOWS_SHAPED=1)" if windows_shaped()
                else "on Windows they need GCC/Clang (MSVC's cl is not supported)")


def target_arch() -> str:
    """The ``-march`` ``load_library`` builds for: this CPU's, unless ``HEADINFER_NATIVE_ARCH`` names another
    (``x86-64-v3``: an AVX2 CPU's vector paths; ``x86-64``: the portable C), to test what other CPUs run."""
    return os.environ.get("HEADINFER_NATIVE_ARCH") or "native"


def cpu_identity() -> str:
    """``-march=native`` code runs only on this CPU family: its model and flags name what it was built for."""
    try:
        with open("/proc/cpuinfo") as info:
            return "".join(sorted({line for line in info if line.startswith(("model name", "flags"))}))
    except OSError:
        return platform.processor() or platform.machine()
