"""The host attention kernel in C (``host_pool.c`` + ``host_kernel.c``), built once per machine with the system's C
compiler (``engine.native.library.compiler``; the other C kernels, ``cpu/int8_matmul.py`` and ``gguf_blocks.py``,
are built by ``engine.native.library.load_library``).

Through torch ops a tile costs a widening copy and two small-M matmuls: a few GB/s per core, a fraction of what a
core reads. The C kernel takes one layer's host-attended head groups in one call (``attend_layer``): its own
pthread pool, the homes read once in their stored dtype (bf16/fp16/fp32, 8-bit codes with their scales), the
log-sum-exp merge and the output's rounding done in C; ``ctypes`` releases the GIL for the call.

``host_kernel.c`` is compiled once per vector path into its own object (on x86-64: portable SSE2, AVX2+FMA,
AVX-512, AVX-512 with bf16 dot products; elsewhere the portable one, which is NEON on arm64), linked with
``host_pool.c`` into one library in the studio's kernel folder (named by a hash of the sources, the compiler and
the flags; loaded only as its build recorded it, ``engine.native.trusted``); the pool picks the widest path the CPU has (cpuid) at run time.
``HEADINFER_HOST_KERNEL=portable|avx2|avx512|avx512bf16`` forces one (tests, and a user whose CPU misreports),
``HEADINFER_HOST_PREFETCH=l1|l2`` the cache level the homes' next lines are requested into (default: L1 on AMD, L2
elsewhere), ``HEADINFER_HOST_POOL=split`` its calls onto its copy of ``split_pool.h`` (an A/B:
docs/benchmarks/thread-pools.md); ``HEADINFER_NATIVE=0`` forces the torch tile. Without a compiler, or if the build
fails, ``kernel()`` returns None (logged) and ``host_attention.py`` runs its torch tile.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import subprocess
import threading
from pathlib import Path

from ..native import crash_probe, trusted
from ..native.library import compiler, is_msvc

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("host_kernel.c")
_POOL = Path(__file__).with_name("host_pool.c")
_HEADER = Path(__file__).with_name("host_kernel.h")
_COMMON = Path(__file__).parents[1] / "native" / "common.h"  # the helpers both include
_SPLIT_POOL = Path(__file__).parents[1] / "native" / "split_pool.h"  # host_pool.c's other pool
_SOURCES = (_SOURCE, _POOL, _HEADER, _COMMON, _SPLIT_POOL)  # what a build is of: its hash names library and probe
_HOST_FLAGS = ["-O3", "-fPIC", "-fno-math-errno", "-fno-trapping-math", "-pthread"]
# Vector paths (x86-64): each compiles host_kernel.c once more; one that fails to build is left out (logged).
_AVX512 = ["-DHA_VARIANT_AVX512", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c",
           "-mprefer-vector-width=512"]
# avx512bf16: the AVX-512 path plus bf16 dot products for the scores of bf16 homes whose queries are bf16 values (a
# bf16 model's; host_kernel.c scores_d128_dot); the other calls run as on avx512.
_X86_PATHS = {"avx2": ["-DHA_VARIANT_AVX2", "-mavx2", "-mfma", "-mf16c"], "avx512": _AVX512,
              "avx512bf16": [*_AVX512, "-DHA_BF16_DOT", "-mavx512bf16"]}
PATHS = {"auto": 0, "portable": 1, "avx2": 2, "avx512": 3, "avx512bf16": 4}
ENV_PATH = "HEADINFER_HOST_KERNEL"
#: Where bf16/fp16/fp32 homes' next lines are requested (host_kernel.c): ``auto`` is L1 on AMD, L2 elsewhere.
PREFETCH = {"auto": 0, "l1": 1, "l2": 2}
ENV_PREFETCH = "HEADINFER_HOST_PREFETCH"
#: Which pool runs a call that no other library's pool takes (``share_pool``): the kernel's own, whose workers sleep
#: between calls, or its copy of ``split_pool.h``, whose workers spin (docs/benchmarks/thread-pools.md).
POOLS = {"auto": 0, "own": 0, "split": 1}
ENV_POOL = "HEADINFER_HOST_POOL"
_CHOICES = {ENV_PATH: PATHS, ENV_PREFETCH: PREFETCH, ENV_POOL: POOLS}  # what each variable may name
# The source uses _Float16 where the compiler announces it (GCC 12+, clang 15+) and bit operations elsewhere; a
# compiler that announces it but rejects it gets a second build with the bit operations forced.
_NO_FLOAT16 = "-DHEADINFER_NO_FLOAT16"
DTYPE_CODES = {"torch.float32": 0, "torch.bfloat16": 1, "torch.float16": 2}
CODE_DTYPES = {"torch.int8": 3, "torch.float8_e4m3fn": 4}  # 8-bit homes: codes, read with their scale planes
HEAD_DIMS = (16, 32, 64, 128, 256)  # what host_kernel.c computes


class LayerCall(ctypes.Structure):
    """``ha_call`` of host_kernel.h, field for field."""

    _fields_ = [("kv", ctypes.c_void_p), ("scales", ctypes.c_void_p), ("query", ctypes.c_void_p),
                ("out", ctypes.c_void_p), ("q_strides", ctypes.c_long * 4), ("out_strides", ctypes.c_long * 4),
                ("start", ctypes.c_long),
                ("stop", ctypes.c_long), ("window", ctypes.c_long), ("tile_bytes", ctypes.c_long),
                ("scaling", ctypes.c_float), ("softcap", ctypes.c_float), ("num_groups", ctypes.c_int),
                ("batch", ctypes.c_int), ("group", ctypes.c_int), ("dim", ctypes.c_int), ("n_rep", ctypes.c_int),
                ("q_len", ctypes.c_int), ("kv_dtype", ctypes.c_int), ("query_dtype", ctypes.c_int),
                ("out_dtype", ctypes.c_int), ("num_threads", ctypes.c_int), ("variant", ctypes.c_int),
                ("prefetch", ctypes.c_int), ("runner", ctypes.c_void_p)]


def build_host_kernel() -> None:
    """Builds (once per machine, into the cache) and loads the host attention kernel now, where a start can afford
    the compiler (``launch.py``: beside the model's loading, before ready), not in the first forward after ready."""
    kernel()


@functools.cache
def kernel():
    """The C layer function ``host_attend_layer``, or None where it cannot be built or failed its probe (the torch
    tile then runs).

    Its vector paths are picked by cpuid on a CPU nobody here tested: the built library is tried once in a child
    process (``crash_probe``, remembered on disk per CPU and sources) before this process calls it, so that an
    illegal instruction or a segfault costs a child, not the server."""
    function = _unprobed_kernel()
    if function is None:
        return None
    key = (hashlib.sha256(b"\0".join(path.read_bytes() for path in _SOURCES)).hexdigest(),)
    if not crash_probe.survives("host-attention", PROBE, key):
        logger.warning("host attention: the C kernel failed its probe on this CPU; using the torch tile (slower)")
        return None
    return function


PROBE = f"{__name__}:exercise_kernel"  # a name, so that a test can aim the probe at a crash


def exercise_kernel() -> None:
    """The host-attention probe (run in a child process): the built kernel on the path this CPU picks, one decode
    query over fp32, bf16 and fp16 homes of a few lengths (within a chunk, across chunks and tiles), and bf16
    queries over a bf16 home of head dim 128 (the bf16 dot products), checked against softmax(q·kᵀ)·v in
    float64."""
    import torch

    function = _unprobed_kernel()
    generator = torch.Generator().manual_seed(0)
    group, n_rep, dim = 2, 3, 64
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for length in (1, 37, 300):
            block = torch.randn(length, 1, 2, group, dim, generator=generator).to(dtype)  # [n, B, 2, g, D]
            query = torch.randn(1, group * n_rep, 1, dim, generator=generator)  # [B, H, Q, D], fp32
            out = torch.empty_like(query)
            attend_layer(query, [block], 0, length, out, scaling=dim**-0.5, function=function)
            keys = block[:, 0, 0].double().repeat_interleave(n_rep, dim=1)  # [n, H, D]: query head h reads h // n_rep
            values = block[:, 0, 1].double().repeat_interleave(n_rep, dim=1)
            weights = torch.einsum("hd,nhd->hn", query[0, :, 0].double(), keys).mul(dim**-0.5).softmax(-1)
            expected = torch.einsum("hn,nhd->hd", weights, values)  # [H, D]
            error = (out[0, :, 0].double() - expected).abs().max().item()
            assert error < 1e-4, f"host attention wrong by {error} ({dtype}, {length} keys)"
    # bf16 queries over bf16 homes of head dim 128: the path's bf16 dot products, where the CPU reports them
    block = torch.randn(300, 1, 2, 1, 128, generator=generator).to(torch.bfloat16)
    query = torch.randn(1, 4, 1, 128, generator=generator).to(torch.bfloat16)
    out = torch.empty_like(query)
    attend_layer(query, [block], 0, 300, out, scaling=128**-0.5, function=function)
    weights = torch.einsum("hd,nd->hn", query[0, :, 0].double(), block[:, 0, 0, 0].double()).mul(128**-0.5)
    expected = torch.einsum("hn,nd->hd", weights.softmax(-1), block[:, 0, 1, 0].double())
    error = (out[0, :, 0].double() - expected).abs().max().item()
    assert error < 1e-2, f"host attention wrong by {error} (bf16 queries, head dim 128)"


def _unprobed_kernel():
    """``kernel()``'s function as built and chosen, not yet probed (what the probe's child calls)."""
    if os.environ.get("HEADINFER_NATIVE", "1") == "0":
        return None
    found = compiler()
    if found is None:
        logger.info("host attention: no C compiler found, using the torch tile (slower)")
        return None
    if is_msvc(found):  # host_kernel.c's vectors are GCC's vector extensions, which MSVC has not
        logger.info("host attention: MSVC's cl cannot build host_kernel.c (GCC vector extensions), using the torch "
                    "tile (slower)")
        return None
    function = build(found)
    if function is not None:
        requested = forced_path()
        chosen = function.variant(PATHS[requested])
        names = {code: name for name, code in PATHS.items()}
        logger.info("host attention kernel: the %s path%s", names.get(chosen, "no"),
                    f" ({ENV_PATH}={requested})" if requested != "auto" else " (the widest this CPU runs)")
        if chosen == 0:
            logger.warning("host attention: the %s path is not available here: using the torch tile", requested)
            return None
        function.use_split_pool(POOLS[forced_pool()])
    return function


def forced_path() -> str:
    """``HEADINFER_HOST_KERNEL`` (``auto`` unless set): the vector path every call asks for."""
    return _parsed(ENV_PATH, os.environ.get(ENV_PATH))


def forced_pool() -> str:
    """``HEADINFER_HOST_POOL`` (``auto`` unless set): ``split`` runs the kernel's calls on its split pool."""
    return _parsed(ENV_POOL, os.environ.get(ENV_POOL))


def forced_prefetch() -> str:
    """``HEADINFER_HOST_PREFETCH`` (``auto`` unless set): where every call requests its homes' next lines."""
    return _parsed(ENV_PREFETCH, os.environ.get(ENV_PREFETCH))


@functools.lru_cache(maxsize=16)
def _parsed(name: str, value: str | None) -> str:
    choices = _CHOICES[name]
    requested = (value or "auto").strip().lower() or "auto"
    if requested not in choices:
        logger.warning("%s=%s is none of %s: ignored", name, requested, ", ".join(choices))
        return "auto"
    return requested


def build(compiler: str, extra: list[str] | None = None):
    """``host_attend_layer`` from the library built with ``extra`` compiler arguments (first without, then with
    ``_NO_FLOAT16`` if that fails), or None; its ``variant(requested)`` gives the path a call would run."""
    errors = []
    for attempt in ([*(extra or [])], [*(extra or []), _NO_FLOAT16]):
        try:
            library = _built_host(compiler, attempt)
            break
        except (OSError, subprocess.SubprocessError) as error:
            errors.append(str(error))
    else:
        logger.warning("building the host attention kernel failed: %s; using the torch tile (slower)", errors[-1])
        return None
    function = library.host_attend_layer
    function.argtypes, function.restype = [ctypes.POINTER(LayerCall)], ctypes.c_int
    variant = library.host_attend_variant
    variant.argtypes, variant.restype = [ctypes.c_int], ctypes.c_int
    prefetch = library.host_attend_prefetch
    prefetch.argtypes, prefetch.restype = [ctypes.c_int], ctypes.c_int
    scratch_bytes = library.host_scratch_bytes
    scratch_bytes.argtypes, scratch_bytes.restype = [], ctypes.c_long
    read = library.host_read
    read.argtypes, read.restype = [ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_int], ctypes.c_double
    use_split = library.host_use_split_pool
    use_split.argtypes, use_split.restype = [ctypes.c_int], ctypes.c_int
    split_tasks = library.host_split_worker_tasks
    split_tasks.argtypes, split_tasks.restype = [], ctypes.c_long
    own_tasks = library.host_own_worker_tasks
    own_tasks.argtypes, own_tasks.restype = [], ctypes.c_long
    dot_tasks = ctypes.c_long.in_dll(library, "ha_bf16_dot_tasks")
    l1_tasks = ctypes.c_long.in_dll(library, "ha_l1_prefetch_tasks")
    function.variant, function.read, function.prefetch = variant, read, prefetch
    function.scratch_bytes = scratch_bytes  # what the pool keeps between calls (tests)
    function.use_split_pool = use_split  # 1: its split pool, 0: its own; returns the previous setting
    function.split_worker_tasks = split_tasks  # ranges the split pool's workers ran so far (tests: which pool ran)
    function.own_worker_tasks = own_tasks  # tasks the own pool's workers ran so far
    function.dot_tasks = lambda: dot_tasks.value  # tasks scored by bf16 dot products so far (tests: the path ran)
    function.l1_prefetch_tasks = lambda: l1_tasks.value  # tasks that requested lines into L1 (tests)
    return function


def read(buffer, num_threads: int = 0) -> float:
    """A plain read of ``buffer`` (contiguous floats) on ``num_threads`` threads of the kernel's pool (0: every core)
    at the kernel's vector width: the yardstick of ``benchmarks.cpu.host_attention``. Returns the sum."""
    return kernel().read(buffer.data_ptr(), buffer.nbytes, num_threads, PATHS[forced_path()])


def _built_host(compiler: str, extra: list[str]) -> ctypes.CDLL:
    """The kernel library: host_kernel.c once per vector path, host_pool.c told which paths built; loaded from the
    kernel folder only as its build recorded it (``engine.native.trusted``), rebuilt otherwise."""
    paths = _vector_paths()

    def build(library: Path) -> None:
        folder = library.parent  # the build's own scratch folder
        base = [compiler, *_HOST_FLAGS, *extra, "-c"]
        running = {name: subprocess.Popen([*base, *flags, "-o", f"{folder}/{name}.o", str(_SOURCE)],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for name, flags in paths.items()}  # at once: each takes seconds
        built = []
        for name, process in running.items():
            _, stderr = process.communicate(timeout=300)
            if process.returncode == 0:
                built.append(name)
            elif name == "portable":
                raise OSError(stderr.strip()[-500:])
            else:
                logger.info("host attention: the %s path did not build (%s)", name, stderr.strip()[-200:])
        has = [f"-DHA_HAS_{name.upper()}" for name in built if name != "portable"]
        pool = subprocess.run([*base, *has, "-o", f"{folder}/pool.o", str(_POOL)], capture_output=True, text=True,
                              timeout=120)
        if pool.returncode != 0:
            raise OSError(pool.stderr.strip()[-500:])
        linked = subprocess.run([compiler, "-shared", "-pthread", "-o", str(library),
                                 *[f"{folder}/{name}.o" for name in [*built, "pool"]], "-lm"],
                                capture_output=True, text=True, timeout=120)
        if linked.returncode != 0:
            raise OSError(linked.stderr.strip()[-500:])
        logger.info("built the host attention kernel (%s) into %s", ", ".join(built),
                    trusted.kernel_folder() / library.name)

    return trusted.load(host_library_name(compiler, extra), build)


def _vector_paths() -> dict[str, list[str]]:
    is_x86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")
    return {"portable": [], **(_X86_PATHS if is_x86 else {})}


def host_library_name(compiler: str, extra: list[str]) -> str:
    """The file name of the kernel library built with ``extra``: a hash of the sources, compiler and flags."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    sources = b"\0".join(path.read_bytes() for path in _SOURCES)
    digest = hashlib.sha256(b"\0".join([sources, version.encode(), platform.machine().encode(),
                                        repr((_HOST_FLAGS, extra, _vector_paths())).encode()])).hexdigest()[:16]
    return f"host_attention-{digest}.so"


#: Query tokens up to which a CPU step attends in one C call (decode, short follow-ups: ``kernels._cpu_tile``);
#: longer chunks (a prefill) take the kernel a block of queries a call (``kernels._cpu_prefill``).
CPU_QUERY_LIMIT = 16


def kv_code(kv_dtype, has_scales: bool) -> int | None:
    """The kernel's code for homes of ``kv_dtype`` (8-bit: only with their scale planes), or None."""
    name = str(kv_dtype)
    return CODE_DTYPES.get(name) if has_scales else DTYPE_CODES.get(name)


def can_attend(query, kvs, scales=None) -> bool:
    """Whether the C kernel takes this call (a compiler, its head dims and dtypes, contiguous homes)."""
    return (kernel() is not None and query.shape[-1] in HEAD_DIMS and str(query.dtype) in DTYPE_CODES
            and kv_code(kvs[0].dtype, scales is not None) is not None and all(kv.is_contiguous() for kv in kvs))


_shared_pool: int | None = None  # another library's pool runner (``ha_runner``), or None: the kernel's own


def share_pool(runner: int | None) -> None:
    """Runs the kernel's tasks on another C library's pool from now on: ``runner``, the address of a function of
    ``ha_runner``'s signature (gguf_gemv.c's ``gguf_split_run``); None: the kernel's own pool again.

    Why: the kernel's own workers, asleep through the GEMVs between a layer's attentions, cost a wake-up each layer,
    and two pools' workers contend for the same cores (docs/benchmarks/pool-bytes-shared.md)."""
    global _shared_pool
    _shared_pool = runner


def attend_layer(query, kvs, start: int, stop: int, out, *, scaling: float, window: int | None = None,
                 softcap: float | None = None, scales=None, num_threads: int = 0, tile_bytes: int = 0,
                 function=None, prefetch: str | None = None) -> None:
    """One layer's host attention in one C call, on this thread and the kernel's pool (``can_attend`` first).

    query: [B, Gh * g * n_rep, Q, D] (any strides), its Q tokens the last Q of ``[start, stop)``; kvs: Gh homes
    [capacity, B, 2, g, D] (8-bit: codes, with ``scales`` their [capacity, B, 2, g, 1] fp32 planes); out:
    [B, Gh * g * n_rep, Q, D] (any strides: a query block of a prefill chunk writes into the chunk's output),
    written in its dtype. ``num_threads``: 0 for every core. ``function``:
    a library from ``build`` (tests) instead of ``kernel()``'s. ``prefetch``: a key of ``PREFETCH`` (benchmarks,
    tests) instead of ``HEADINFER_HOST_PREFETCH``'s.
    """
    call = _prepared(query, kvs, scales, out)
    call.query, call.out = query.data_ptr(), out.data_ptr()
    call.q_strides[:], call.out_strides[:] = query.stride(), out.stride()
    call.start, call.stop, call.window, call.tile_bytes = start, stop, window or 0, tile_bytes
    call.scaling, call.softcap = scaling, softcap or 0.0
    call.num_threads, call.variant, call.runner = num_threads, PATHS[forced_path()], _shared_pool
    call.prefetch = PREFETCH[forced_prefetch()] if prefetch is None else PREFETCH[prefetch]
    check((function or kernel())(call._ref), query.shape[-1])


_calls = threading.local()  # per thread (a call's struct is filled, then read by C while the GIL is released)
_MAX_PREPARED = 64  # layers x (streamed, host) variants of a model's decode step, with room to spare


def _prepared(query, kvs, scales, out) -> LayerCall:
    """The call's struct with its homes' pointer arrays and shapes filled, cached per thread by the homes'
    addresses and the shapes: a decode step calls every layer with the same homes, and building the struct and
    its ctypes arrays cost more than the kernel's own fixed cost (about 10 us of Python per call)."""
    cache = getattr(_calls, "cache", None)
    if cache is None:
        cache = _calls.cache = {}
    key = (tuple(kv.data_ptr() for kv in kvs), None if scales is None else tuple(s.data_ptr() for s in scales),
           kvs[0].shape[1:], kvs[0].dtype, query.shape, query.dtype, out.dtype)
    call = cache.get(key)
    if call is not None:
        return call
    batch, num_heads, q_len, head_dim = query.shape
    _, _, _, group, _ = kvs[0].shape
    num_groups = len(kvs)
    call = LayerCall()
    call._pointers = (ctypes.c_void_p * num_groups)(*key[0])  # kept alive with the struct
    call.kv = ctypes.cast(call._pointers, ctypes.c_void_p)
    if scales is not None:
        call._scale_pointers = (ctypes.c_void_p * num_groups)(*key[1])
        call.scales = ctypes.cast(call._scale_pointers, ctypes.c_void_p)
    call.num_groups, call.batch, call.group, call.dim = num_groups, batch, group, head_dim
    call.n_rep, call.q_len = num_heads // (num_groups * group), q_len
    call.kv_dtype = kv_code(kvs[0].dtype, scales is not None)
    call.query_dtype, call.out_dtype = DTYPE_CODES[str(query.dtype)], DTYPE_CODES[str(out.dtype)]
    call._ref = ctypes.byref(call)
    if len(cache) >= _MAX_PREPARED:  # homes reallocated (a new session): start over
        cache.clear()
    cache[key] = call
    return call


def attend_span(query, span, *, q_offset: int, scaling: float, window: int | None, softcap: float | None,
                 num_threads: int = 1):
    """Exact attention of a few CPU queries over a token-major span through the C kernel; None where it does
    not apply (no compiler, a head dim or dtype it does not compute, a strided span).

    query: [B, Hq, Q, D]; span: [K, B, 2, Hk, D] with K = q_offset + Q. Returns [B, Hq, Q, D] in the query's dtype.

    Why: SDPA reads a token-major home's keys with a stride (keys and values of every head interleaved per token),
    at a third of the memory speed on a decode step; the kernel reads the span once, in order
    (docs/benchmarks/llamacpp.md has the measurements).
    """
    import torch

    if not can_attend(query, [span]):
        return None
    assert span.shape[0] == q_offset + query.shape[2], (span.shape, q_offset, query.shape)
    out = torch.empty(query.shape, dtype=query.dtype)
    attend_layer(query, [span], 0, span.shape[0], out, scaling=scaling, window=window, softcap=softcap,
                 num_threads=num_threads)
    return out


def check(status: int, head_dim: int) -> None:
    """Raises for a failure status of the C kernel."""
    if status == -2:
        raise MemoryError("host attention: no memory for the kernel's scratch")
    if status == -3:
        raise RuntimeError(f"host attention: the {forced_path()} path is not available on this CPU")
    assert status == 0, f"host attention kernel: status {status} (head dim {head_dim})"
