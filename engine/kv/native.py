"""The host attention tile in C (``host_kernel.c``), built once per machine with the system's C compiler.

Through torch ops a tile costs a widening copy and two small-M matmuls: a few GB/s per core, a fraction of what
a core reads. The C tile widens each block of keys and values in L1, keeps the online softmax in fp32 and sums
16 dot products with one transpose-and-add: 2-3x the torch tile per core on the development VM. It is compiled
on first use (``-O3 -march=native``: this CPU's vector units) into the studio's cache folder, under a name
hashing the source, the compiler, the flags and the CPU, and called through ``ctypes``, which releases the GIL
for the call, so the worker threads run tiles at once. Without a compiler, or if every build fails, ``kernel()``
returns None (logged once) and ``host_attention.py`` runs the same tile through torch ops. ``HEADINFER_NATIVE=0``
forces that path. ``HEADINFER_NATIVE_ARCH`` builds every C kernel for another ``-march`` than ``native`` (e.g.
``x86-64-v3``: an AVX2 CPU's vector paths; ``x86-64``: the portable C), to test what other CPUs run. Where the compiler has no ``_Float16`` (GCC < 12), fp16 is widened with bit operations.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..paths import cache_dir

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("host_kernel.c")
_FLAGS = ["-O3", "-fopenmp-simd", "-fno-math-errno", "-shared", "-fPIC"]
# First choice links glibc's vector math library (a block's 16 exponentials in one call); the second does without.
# The source widens fp16 with _Float16 where the compiler announces it and with bit operations elsewhere (GCC < 12);
# the last two variants force the bit operations, for a compiler that announces _Float16 but rejects it.
_NO_FLOAT16 = "-DHEADINFER_NO_FLOAT16"
_VARIANTS = [["-lmvec", "-lm"], ["-DHEADINFER_NO_LIBMVEC", "-lm"],
             [_NO_FLOAT16, "-lmvec", "-lm"], [_NO_FLOAT16, "-DHEADINFER_NO_LIBMVEC", "-lm"]]
DTYPE_CODES = {"torch.float32": 0, "torch.bfloat16": 1, "torch.float16": 2}
HEAD_DIMS = (16, 32, 64, 128, 256)  # the specialisations in host_kernel.c

_long, _int, _float, _ptr = ctypes.c_long, ctypes.c_int, ctypes.c_float, ctypes.c_void_p
# int host_attend_tile(tile, dtype, elem_size, n, batch, group, dim, query, rows, q_len, first, past, window,
#                      softcap, m_out, l_out, acc_out)
_ARGTYPES = [_ptr, _int, _int, _long, _int, _int, _int, _ptr, _int, _int, _long, _long, _long, _float, _ptr, _ptr, _ptr]


@functools.cache
def kernel():
    """The C tile function, or None where it cannot be built (the torch tile then runs)."""
    if os.environ.get("HEADINFER_NATIVE", "1") == "0":
        return None
    found = compiler()
    if found is None:
        logger.info("host attention: no C compiler found, using the torch tile (slower)")
        return None
    return build(found, _VARIANTS)


def build(compiler: str, variants: list[list[str]]):
    """The C tile function from the first of ``variants`` (extra compiler arguments) that builds, or None."""
    library = load_library(compiler, _SOURCE, variants)
    if library is None:  # load_library logged why
        logger.info("host attention: using the torch tile (slower)")
        return None
    function = library.host_attend_tile
    function.argtypes, function.restype = _ARGTYPES, ctypes.c_int
    return function


def load_library(compiler: str, source: Path, variants: list[list[str]]) -> ctypes.CDLL | None:
    """``source`` compiled once per machine into the cache (``-O3 -march=native`` plus the first of ``variants``
    that builds) and loaded; None if every variant fails (logged)."""
    errors = []
    for variant in variants:
        try:
            return ctypes.CDLL(str(_built(compiler, variant, source)))
        except (OSError, subprocess.SubprocessError) as error:
            errors.append(str(error))
    logger.warning("building %s failed: %s", source.name, errors[-1] if errors else "no variants")
    return None


def _built(compiler: str, variant: list[str], source: Path = _SOURCE) -> Path:
    variant = [f"-march={target_arch()}", *variant]
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    digest = hashlib.sha256(b"\0".join([source.read_bytes(), version.encode(), " ".join(_FLAGS + variant).encode(),
                                        cpu_identity().encode()])).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"{source.stem}-{digest}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as folder:
        built = Path(folder) / target.name
        done = subprocess.run([compiler, *_FLAGS, "-o", str(built), str(source), *variant], capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0:
            raise OSError(done.stderr.strip()[-500:])
        os.replace(built, target)  # atomic: a concurrent process loads the old file or the complete new one
    logger.info("built %s into %s", source.name, target)
    return target


def compiler() -> str | None:
    """The C compiler the kernels are built with (``$CC``, else ``cc``/``gcc``), or None."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def target_arch() -> str:
    """The ``-march`` the kernels are built for: this CPU's, unless ``HEADINFER_NATIVE_ARCH`` names another."""
    return os.environ.get("HEADINFER_NATIVE_ARCH") or "native"


def cpu_identity() -> str:
    """``-march=native`` code runs only on this CPU family: its model and flags name what it was built for."""
    try:
        with open("/proc/cpuinfo") as info:
            return "".join(sorted({line for line in info if line.startswith(("model name", "flags"))}))
    except OSError:
        return platform.processor() or platform.machine()


#: Query tokens up to which a CPU step attends through the C tile (decode, short follow-ups). A prefill chunk's
#: rows (n_rep x Q) would each re-read the chunk's keys in L1: SDPA's blocked matmuls do that better.
CPU_QUERY_LIMIT = 16


def attend_block(query, block, *, q_offset: int, scaling: float, window: int | None, softcap: float | None):
    """Exact attention of a few CPU queries over a token-major block through the C tile, on this thread; None
    where it does not apply (no compiler, a head dim or dtype without a specialisation, a strided block).

    query: [B, Hq, Q, D]; block: [K, B, 2, Hk, D] with K = q_offset + Q. Returns [B, Hq, Q, D] in the query's dtype.

    Why: SDPA reads a token-major home's keys with a stride (keys and values of every head interleaved per token),
    at a third of the memory speed on a decode step; the tile reads the block once, in order, widening each chunk
    of keys and values in L1 (docs/benchmarks/llamacpp.md has the measurements).
    """
    import torch

    function = kernel()
    batch, num_heads, q_len, head_dim = query.shape
    _, _, _, num_kv_heads, _ = block.shape
    dtype = DTYPE_CODES.get(str(block.dtype))
    if function is None or dtype is None or head_dim not in HEAD_DIMS or not block.is_contiguous():
        return None
    n_rep = num_heads // num_kv_heads
    rows = n_rep * q_len
    # [B, Hq, Q, D] -> [B, Hk, n_rep * Q, D] fp32: a KV head's query heads are rows of one matrix, in (repeat,
    # query) order; the scale (and 1 / softcap, which the tile undoes inside tanh) is folded in once.
    # (transformers' queries are transposed views: the copy lays them out as the tile reads them.)
    folded = torch.empty(batch, num_kv_heads, rows, head_dim)
    folded.copy_(query.reshape(batch, num_kv_heads, rows, head_dim)).mul_(scaling / softcap if softcap else scaling)
    m = torch.empty(batch, num_kv_heads, rows, 1)
    l = torch.empty_like(m)
    acc = torch.empty(batch, num_kv_heads, rows, head_dim)
    status = function(block.data_ptr(), dtype, block.element_size(), block.shape[0], batch, num_kv_heads,
                      head_dim, folded.data_ptr(), rows, q_len, 0, q_offset, window or 0, softcap or 0.0,
                      m.data_ptr(), l.data_ptr(), acc.data_ptr())
    check(status, head_dim)
    # Every query sees at least its own key, so l > 0.
    return acc.div_(l).to(query.dtype).reshape(batch, num_heads, q_len, head_dim)


def check(status: int, head_dim: int) -> None:
    """Raises for a C tile's failure status: -2 its scores could not be allocated, -1 no such head dim."""
    if status == -2:
        raise MemoryError("host attention tile: no memory for its scores")
    assert status == 0, f"no C tile for head dim {head_dim}"
