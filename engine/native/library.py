"""Building C code for this machine: the compiler, and ``load_library``, which compiles a source once per machine
into the studio's kernel folder and loads it (``trusted``: only as built). The weights' kernels
(``cpu/int8_matmul.py``, ``cpu/gguf_blocks.py``) are built here; the KV's host attention kernel
(``kv/native.py``) takes the compiler from here and links its own vector paths. The ground floor: it imports only
``paths``, ``paths_windows`` (and ``trusted``, which imports only ``paths``), so ``kv/`` and ``cpu/`` both stand
on it.

On Windows the compiler is MSVC's ``cl`` where it is on PATH (a "Developer PowerShell for VS"): the same build with
MSVC's flags (``msvc_command``) into a ``.dll``; a build it refuses is logged once and the torch paths run.
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
from pathlib import Path, PureWindowsPath

from ..paths_windows import windows_rules, windows_shaped
from . import trusted
from .trusted import kernel_folder

logger = logging.getLogger(__name__)

_FLAGS = ["-O3", "-fopenmp-simd", "-fno-math-errno", "-shared", "-fPIC", "-pthread"]  # load_library's (plus -march)
# MSVC's for the same build: /O2 (its fastest), a DLL, '#pragma omp simd' (no OpenMP runtime, as -fopenmp-simd), and
# no contracted multiply-adds (/fp:precise, as -ffp-contract=off). -fPIC and -pthread have none; -fno-math-errno none
# needed (MSVC's inlined math never sets errno).
_MSVC_FLAGS = ["/nologo", "/O2", "/LD", "/openmp:experimental", "/fp:precise"]
_MSVC_VARIANT = {"-ffp-contract=off": []}  # a gcc variant flag -> MSVC's (the -D defines carry over as /D)
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
    if is_msvc(compiler):  # one line: cl's first error (its last line may be "compilation terminated.")
        said = (errors[-1] if errors else "").splitlines()
        reason = next((line for line in said if "error" in line), said[-1] if said else "no output")
        logger.warning("C kernels: MSVC's cl did not build %s (%s); the torch paths run instead (docs/windows.md)",
                       source.name, reason.strip())
    else:
        logger.warning("building %s failed: %s", source.name, errors[-1] if errors else "no variants")
    return None


def _built(compiler: str, variant: list[str], source: Path) -> ctypes.CDLL:
    name = library_name(compiler, variant, source)

    def build(output: Path) -> None:
        command = msvc_command(compiler, variant, source, output) if is_msvc(compiler) else \
            [compiler, *_FLAGS, "-o", str(output), str(source), f"-march={target_arch()}", *variant]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:  # (cl writes its errors to stdout)
            raise OSError((done.stderr.strip() or done.stdout.strip())[-500:])
        logger.info("built %s into %s", source.name, kernel_folder() / output.name)

    return trusted.load(name, build)


def is_msvc(compiler: str) -> bool:
    """Whether ``compiler`` is MSVC's ``cl`` (its flags are /O2, not -O3)."""
    return PureWindowsPath(compiler).name.lower() in ("cl", "cl.exe")  # (either slash)


def msvc_command(compiler: str, variant: list[str], source: Path, output: Path) -> list[str]:
    """``cl``'s command line for ``load_library``'s build of ``source`` with the gcc ``variant`` into the DLL
    ``output`` (its object file beside it, in the build's scratch folder)."""
    translated = [flag for gcc in variant for flag in
                  ([f"/D{gcc[2:]}"] if gcc.startswith("-D") else _MSVC_VARIANT.get(gcc, [gcc]))]
    return [compiler, *_MSVC_FLAGS, *msvc_arch(), *translated, str(source), f"/Fo{output.parent}{os.sep}",
            f"/Fe{output}"]


def msvc_arch() -> list[str]:
    """MSVC's ``/arch`` for ``target_arch`` (it has no -march=native): AVX-512 or AVX2 where this CPU runs them."""
    wanted = target_arch()
    levels = {"x86-64": 0, "x86-64-v2": 0, "x86-64-v3": 2, "x86-64-v4": 3}
    level = levels.get(wanted, 0) if wanted != "native" else _cpu_vector_level()
    return {3: ["/arch:AVX512"], 2: ["/arch:AVX2"]}.get(level, [])


def _cpu_vector_level() -> int:
    """3 with AVX-512 (F, BW, VL), 2 with AVX2 and FMA, else 0: from /proc/cpuinfo, or Windows' own answer."""
    flags = set(cpu_identity().split())
    if not flags and os.name == "nt":  # IsProcessorFeaturePresent: PF_AVX2 (40), PF_AVX512F (41)
        present = ctypes.windll.kernel32.IsProcessorFeaturePresent
        return 3 if present(41) else 2 if present(40) else 0
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        return 3
    return 2 if {"avx2", "fma"} <= flags else 0


def library_name(compiler: str, variant: list[str], source: Path) -> str:
    """The file name of ``source``'s build with ``variant`` (and ``target_arch``): a hash of what it is built from."""
    msvc = is_msvc(compiler)
    variant = [*(msvc_arch() if msvc else [f"-march={target_arch()}"]), *variant]
    # (cl has no --version: its banner, on stderr, names its version)
    done = subprocess.run([compiler] if msvc else [compiler, "--version"], capture_output=True, text=True, timeout=30)
    version = done.stderr if msvc else done.stdout
    flags = " ".join((_MSVC_FLAGS if msvc else _FLAGS) + variant)
    digest = hashlib.sha256(b"\0".join([source_bytes(source), version.encode(), flags.encode(),
                                        cpu_identity().encode()])).hexdigest()[:16]
    return f"{source.stem}-{digest}.{'dll' if msvc or os.name == 'nt' else 'so'}"


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

    Under Windows' rules (``engine.paths_windows``) MSVC's ``cl`` where it is on PATH (``msvc_command`` gives its
    flags), else None: a Windows PC without Visual Studio's tools runs the torch paths (logged once)."""
    if windows_rules():
        found = shutil.which("cl")
        if found is None:
            _say_no_compiler()
        return found
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@functools.cache
def _say_no_compiler() -> None:
    logger.info("C kernels not built: %s; the torch paths run instead (slower on the CPU, the same results)",
                "Windows-shaped run (HEADINFER_WINDOWS_SHAPED=1) with no cl on PATH" if windows_shaped()
                else "MSVC's cl is not on PATH (start from a Developer PowerShell for VS to use it)")


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
