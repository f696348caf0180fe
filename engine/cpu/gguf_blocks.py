"""A GGUF file's own quantized weights on the CPU: ``load_model(weights="gguf")`` keeps the linear layers stored
as Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K or Q6_K blocks in those very blocks, as llama.cpp does, instead of
dequantizing them to fp32.

Why: a CPU decode step reads every weight once, so its speed at short context is the weights' bytes. A Q4_1 layer
is 0.63 bytes a weight (int8: 1, fp32: 4), and unlike ``int8`` nothing is requantized: the model runs exactly the
weights stock transformers dequantizes from the same file (gguf-py's formulas), so the parity tests compare it with
a stock model loading that GGUF, and its perplexity is the file's.

How the blocks find their layers: transformers' GGUF loader renames tensors and, for some architectures, permutes
rows (Llama's q/k projections, which llama.cpp stores in its own rotary order). Rather than re-implement that per
architecture, each dense ``nn.Linear`` of a model loaded from the file (fp32) is matched to the file's tensor of its
shape (same layer index) whose blocks dequantize to exactly that weight, row for row: bit-identical rows, taken in
the weight's row order. A layer with no such tensor (another block type, a tensor the loader transformed) stays
dense, and the log says how many.

Compute is fp32: ``gguf_gemv.c`` sums decode rows straight from the blocks, a layer's rows split over cores by its
own spinning pthreads (``engine/native/split_pool.h``: a Python pool's hand-off cost as much as a small GEMV). Where
the CPU has AVX-512 VNNI, Q6_K rows are exact integer sums of their codes against the activations taken apart into
22-bit integers per 32 (``gguf_gemv.c`` says how), an error of ~2^-23 of each sub-block's largest activation: within
the fp32 sums' own tolerance, and faster than the fp32 path from memory (``docs/benchmarks/gemv-vnni.md``);
prefill chunks dequantize the layer (exactly as gguf-py does) and take an fp32 matmul (``cpu_matmul``: oneDNN's where
it runs). Without a C compiler gguf-py itself dequantizes every
call (slow, but the same weights).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import re
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..kv import native as host_kernel
from ..native import crash_probe
from ..native import library as native
from . import cpu_matmul
from .heap import trim_heap
from .int8 import install, linear_targets
from .int8_matmul import split_threads

logger = logging.getLogger(__name__)

#: ggml type number -> (name, weights per block, bytes per block); gguf_gemv.c reads each of them
BLOCK_TYPES = {2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24),
               8: ("Q8_0", 32, 34), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210)}
BLOCK = 32  # the smallest block: a layer's input width must be a multiple of its type's block
GEMV_ROWS = 16  # rows from which dequantize-and-matmul is faster (prefill chunks)
_DEQUANT_SLICE_BYTES = 64 << 20  # the most fp32 weight one dequantize-and-matmul call builds
# Decode layers of 2 x this many block bytes and more are split across cores (the C pool of native/split_pool.h): a
# 1536 x 1536 Q4_K projection (1.3 MB, ~0.3 ms on one core) gains more than a hand-off costs, a wake-up of
# 10-50 us at worst (int8's 1 MiB threshold would keep it whole).
_SPLIT_BYTES = 512 << 10
_SOURCE = Path(__file__).with_name("gguf_gemv.c")
# -ffp-contract=off: the dequantization's product and sum are rounded one by one, as numpy does (see the source).
_VARIANTS = [["-ffp-contract=off"]]
_P, _L, _I = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.")
_BLK = re.compile(r"^blk\.(\d+)\.")
_OWN_ROWS = ".rows"  # the layout name of an untied embedding's table (BlockEmbedding.rows)


@functools.cache
def kernel():
    """The C ``Functions``, or None (no compiler, the build failed, or it failed its probe: logged).

    Built with ``-march=native``, the code runs vector paths nobody here tested on this CPU: it is tried once in a
    child process (``crash_probe``, remembered on disk per CPU, source and ``-march``) before this process calls it,
    so that an illegal instruction or a segfault costs a child, not the server."""
    functions = _built_kernel()
    if functions is None:
        return None
    key = (native.source_digest(_SOURCE), native.target_arch())
    if not crash_probe.survives("gguf-gemv", PROBE, key):
        logger.warning("gguf weights: the C kernel failed its probe on this CPU; blocks are dequantized by gguf-py "
                       "at every call (slow)")
        return None
    host_kernel.share_pool(functions.split_run)  # one pool for a decode step's GEMVs and its host attention
    return functions


PROBE = f"{__name__}:exercise_kernel"  # a name, so that a test can aim the probe at a crash


@functools.cache
def _built_kernel():
    """The ``Functions`` as built, not yet probed (what the probe's child calls)."""
    compiler = native.compiler()
    if compiler is None:
        logger.info("gguf weights: no C compiler found; blocks are dequantized by gguf-py at every call (slow)")
        return None
    library = native.load_library(compiler, _SOURCE, _VARIANTS)
    return None if library is None else typed_functions(library)


class Functions(NamedTuple):
    """A build of ``gguf_gemv.c``: the GEMV of a row range, the dequantization of a row range, and both of every
    row split over the caller and the library's own spinning pool (``engine/native/split_pool.h``), with the pool's
    idle spin (set, returns the previous: ns) and the count of tasks its workers ran."""

    gemv: ctypes._CFuncPtr
    dequantize: ctypes._CFuncPtr
    gemv_split: ctypes._CFuncPtr
    dequantize_split: ctypes._CFuncPtr
    split_spin_ns: ctypes._CFuncPtr
    split_worker_tasks: ctypes._CFuncPtr
    decode_attention_in: ctypes._CFuncPtr  # gguf_decode.h: a decode layer's pieces around its attention
    decode_mlp: ctypes._CFuncPtr
    split_run: int  # the address of gguf_split_run: the pool as another library's calls run on it



class Projection(ctypes.Structure):
    """``gd_projection`` (gguf_decode.h): one projection of a fused decode call."""

    _fields_ = [("raw", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("out", ctypes.c_long), ("type", ctypes.c_int)]


def typed_functions(library: ctypes.CDLL) -> Functions:
    """The functions of a build of ``gguf_gemv.c``, their C signatures set (benchmarks load other builds)."""
    gemv, dequantize, gemv_split = library.gguf_gemv, library.gguf_dequantize, library.gguf_gemv_split
    gemv.argtypes, gemv.restype = [_P, _P, _I, _P, _P, _L, _L, _L, _L, _L], ctypes.c_int
    dequantize.argtypes, dequantize.restype = [_P, _I, _L, _L, _L, _P], ctypes.c_int
    gemv_split.argtypes, gemv_split.restype = [_P, _P, _I, _P, _P, _L, _L, _L, _I], ctypes.c_int
    dequantize_split = library.gguf_dequantize_split
    dequantize_split.argtypes, dequantize_split.restype = [_P, _I, _L, _L, _P, _I], ctypes.c_int
    spin, tasks = library.gguf_split_spin_ns, library.gguf_split_worker_tasks
    spin.argtypes, spin.restype, tasks.argtypes, tasks.restype = [_L], _L, [], _L
    attention_in, mlp = library.gguf_decode_attention_in, library.gguf_decode_mlp
    attention_in.argtypes = [_P, _P, ctypes.c_float, _L, _P, _P, _P, ctypes.c_float, _P, _P, _L, _P, _P, _I, _P]
    mlp.argtypes = [_P, _P, _L, _P, _P, ctypes.c_float, _P, _P, _P, _I]
    attention_in.restype = mlp.restype = ctypes.c_int
    return Functions(gemv, dequantize, gemv_split, dequantize_split, spin, tasks, attention_in, mlp,
                     ctypes.cast(library.gguf_split_run, ctypes.c_void_p).value)


# Where each block type keeps its fp16 factors (d; m or dmin): random bytes anywhere else are a valid block.
_FACTOR_OFFSETS = {2: (0,), 3: (0, 2), 6: (0,), 7: (0, 2), 8: (0,), 12: (0, 2), 13: (0, 2), 14: (208,)}


def random_block_rows(rng: np.random.Generator, qtype: int, rows: int, inputs: int) -> torch.Tensor:
    """[rows, inputs / size * nbytes] uint8: random blocks of ``qtype`` with small finite fp16 factors (the probe's
    input, and the benchmarks')."""
    _, size, nbytes = BLOCK_TYPES[qtype]
    raw = rng.integers(0, 256, (rows, inputs // size, nbytes), dtype=np.uint8)
    for offset in _FACTOR_OFFSETS[qtype]:
        factors = (rng.standard_normal((rows, inputs // size)) * 0.01).astype(np.float16)
        raw[..., offset : offset + 2] = factors.view(np.uint8).reshape(rows, -1, 2)
    return torch.from_numpy(raw.reshape(rows, -1))


def exercise_kernel() -> None:
    """The gguf-gemv probe (run in a child process): the built GEMV (decode rows) and dequantization (prefill) on
    every block type, checked against gguf-py's weights."""
    gemv, dequantize_blocks, gemv_split, dequantize_split, *_ = _built_kernel()
    rng = np.random.default_rng(0)
    for qtype, (_, size, _) in BLOCK_TYPES.items():
        out_features, in_features = 9, 2 * max(size, 256)
        raw = random_block_rows(rng, qtype, out_features, in_features)  # [out, in / size * nbytes]
        weight = dequantize_reference(raw, qtype)  # [out, in]
        dense = torch.empty(out_features, in_features)
        _check(dequantize_blocks(raw.data_ptr(), qtype, in_features, 0, out_features, dense.data_ptr()))
        assert torch.equal(dense, weight), f"gguf dequantize differs from gguf-py for type {qtype}"
        dense.fill_(float("nan"))
        _check(dequantize_split(raw.data_ptr(), qtype, in_features, out_features, dense.data_ptr(), 3))
        assert torch.equal(dense, weight), f"gguf dequantize split differs from gguf-py for type {qtype}"
        for rows in (1, 3):
            x = torch.from_numpy(rng.standard_normal((rows, in_features)).astype(np.float32))  # [rows, in]
            y = torch.empty(rows, out_features)
            _check(gemv(x.data_ptr(), raw.data_ptr(), qtype, None, y.data_ptr(), rows, in_features, out_features, 0,
                        out_features))
            expected = x.double() @ weight.double().T
            scale = (x.double().abs() @ weight.double().abs().T).clamp_min(1e-6)
            assert ((y.double() - expected).abs() / scale).max() < 1e-5, f"gguf gemv wrong for type {qtype}"
            split = torch.empty(rows, out_features)
            for threads in (3, 2):  # the pool's first start, then a call taking fewer of its workers
                _check(gemv_split(x.data_ptr(), raw.data_ptr(), qtype, None, split.data_ptr(), rows, in_features,
                                  out_features, threads))
                assert torch.equal(split, y), f"gguf gemv split over {threads} threads differs for type {qtype}"
    exercise_fused_decode(rng, _built_kernel())


def exercise_fused_decode(rng: np.random.Generator, functions: Functions) -> None:
    """The fused decode layer (gguf_decode.h) on one small random layer, against the same steps in torch: a part of
    the probe, so that its vector code runs in the child first too."""
    hidden, heads, dim, inter = 256, 4, 64, 512  # widths of whole Q4_K super-blocks
    mats = {name: (random_block_rows(rng, 12, rows, inputs), rows) for name, rows, inputs in
            [("q", heads * dim, hidden), ("k", dim, hidden), ("v", dim, hidden), ("o", hidden, heads * dim),
             ("gate", inter, hidden), ("up", inter, hidden), ("down", hidden, inter)]}
    weights = {name: dequantize_reference(raw, 12) for name, (raw, _) in mats.items()}
    projection = {name: Projection(raw.data_ptr(), 0, rows, 12) for name, (raw, rows) in mats.items()}
    h = torch.from_numpy(rng.standard_normal(hidden).astype(np.float32))  # [hidden]
    norm = torch.from_numpy(rng.uniform(0.5, 1.5, hidden).astype(np.float32))
    angles = torch.from_numpy(rng.uniform(0, 6, dim // 2).astype(np.float32)).repeat(2)  # [dim]
    cos, sin = angles.cos(), angles.sin()
    qkv, scratch = torch.empty(heads * dim + 2 * dim), torch.empty(hidden + 2 * inter)
    kv_row = torch.full((2, 1, dim), float("nan"))  # [2, KVH, D]: a cache home's row of the token
    head_norm = norm[:dim].flip(0).contiguous()  # Qwen3's per-head q/k norm, [dim]
    _check(functions.decode_attention_in(h.data_ptr(), norm.data_ptr(), 1e-6, hidden,
                                         (Projection * 3)(projection["q"], projection["k"], projection["v"]),
                                         head_norm.data_ptr(), head_norm.data_ptr(), 1e-5, cos.data_ptr(),
                                         sin.data_ptr(), dim, qkv.data_ptr(), scratch.data_ptr(), 2,
                                         kv_row.data_ptr()))
    x = F.rms_norm(h, (hidden,), norm, 1e-6)
    q = F.rms_norm((x @ weights["q"].T).view(heads, dim), (dim,), head_norm, 1e-5)
    k = F.rms_norm((x @ weights["k"].T).view(1, dim), (dim,), head_norm, 1e-5)
    rotate = lambda t: t * cos + torch.cat((-t[:, dim // 2:], t[:, : dim // 2]), -1) * sin  # noqa: E731
    expected = torch.cat([rotate(q).flatten(), rotate(k).flatten(), x @ weights["v"].T])
    assert torch.allclose(qkv, expected, rtol=1e-4, atol=1e-4), "fused decode: attention input differs"
    assert torch.equal(kv_row.flatten(), qkv[heads * dim :]), "fused decode: the k and v written to the row differ"
    attention, updated = torch.from_numpy(rng.standard_normal(heads * dim).astype(np.float32)), h.clone()
    _check(functions.decode_mlp(updated.data_ptr(), attention.data_ptr(), heads * dim, ctypes.byref(projection["o"]),
                                norm.data_ptr(), 1e-6, (Projection * 2)(projection["gate"], projection["up"]),
                                ctypes.byref(projection["down"]), scratch.data_ptr(), 2))
    after = h + attention @ weights["o"].T
    x = F.rms_norm(after, (hidden,), norm, 1e-6)
    after = after + (F.silu(x @ weights["gate"].T) * (x @ weights["up"].T)) @ weights["down"].T
    assert torch.allclose(updated, after, rtol=1e-4, atol=1e-3), "fused decode: MLP differs"


def dequantize_reference(raw: torch.Tensor, qtype: int) -> torch.Tensor:
    """raw: [out, in / block * bytes] uint8 -> [out, in] fp32 through gguf-py itself: the weights stock transformers
    loads (the definition the C dequantization is tested against, and its stand-in without a compiler)."""
    from gguf.quants import dequantize as gguf_dequantize

    return torch.from_numpy(gguf_dequantize(raw.numpy(), qtype).astype(np.float32, copy=False))


def dequantize(raw: torch.Tensor, qtype: int, in_features: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """raw: [out, in / block * bytes] uint8 -> [out, in] fp32, the weights gguf-py gives (through C where built,
    into ``out``, [out, in] fp32, where given)."""
    functions = kernel()
    if functions is None:
        return dequantize_reference(raw, qtype)  # fresh: ``out`` is only a place the C path may write
    raw = raw.contiguous()
    weight = torch.empty(raw.shape[0], in_features) if out is None else out  # [out, in]
    # Rows split over cores like a GEMV's: a prefill chunk dequantizes every layer (slices of up to 64 MB of fp32),
    # and on one thread those writes left the other cores idle between torch's matmuls.
    _check(functions.dequantize_split(raw.data_ptr(), qtype, in_features, raw.shape[0], weight.data_ptr(),
                                      split_threads(raw.numel(), _SPLIT_BYTES)))
    return weight


_SCRATCH_LOCK = threading.Lock()
_scratch: list[torch.Tensor] = []  # the process's one buffer, once a prefill has run


@contextlib.contextmanager
def _weight_scratch(out_features: int, in_features: int):
    """[out, in] fp32 for a weight dequantized only to be multiplied: a view of the process's one reused buffer, or a
    fresh tensor while another thread's matmul holds it. A fresh tensor each call is a fresh mapping whose pages the
    kernel faults in and zeroes at every layer of every prefill chunk (docs/benchmarks/split-pool.md,
    llamacpp-1.5b.md). The buffer stays for the process's life, at most ``_DEQUANT_SLICE_BYTES`` plus a row slice;
    one for the process, not per thread (a UI's handler threads come and go)."""
    if not _SCRATCH_LOCK.acquire(blocking=False):
        yield torch.empty(out_features, in_features)
        return
    try:
        need = out_features * in_features
        if not _scratch or _scratch[0].numel() < need:
            _scratch.clear()  # the old buffer goes before the new one is mapped
            with torch.inference_mode(False):  # a normal tensor: a read under inference mode must not make one
                _scratch.append(torch.empty(need))  # that a later forward outside it could not take
        yield _scratch[0][:need].view(out_features, in_features)
    finally:
        _SCRATCH_LOCK.release()


def by_row_slices(x: torch.Tensor, out_features: int, step: int,
                  product: Callable[[int, int], torch.Tensor]) -> torch.Tensor:
    """x: [..., in] -> [..., out]: ``product(lo, hi)`` (x times the weight's rows [lo, hi) plus their bias,
    [..., hi - lo]) for each slice of ``step`` output rows, written into one output; a layer of at most ``step`` rows
    in one call. The walk of a layer whose weight is expanded from blocks a slice at a time (here, and on a GPU:
    ``models/gguf_device.ExpandingLinear``), so that no call holds a whole lm_head expanded."""
    if out_features <= step:
        return product(0, out_features)
    y = x.new_empty(*x.shape[:-1], out_features)  # [..., out]
    for lo in range(0, out_features, step):
        hi = min(lo + step, out_features)
        y[..., lo:hi] = product(lo, hi)
    return y


def block_linear(x: torch.Tensor, raw: torch.Tensor, qtype: int, bias: torch.Tensor | None) -> torch.Tensor:
    """x: [..., in] fp32; raw: [out, in / block * bytes] uint8 blocks; bias: [out] fp32 or None. Returns
    [..., out]."""
    out_features = raw.shape[0]
    in_features = x.shape[-1]
    rows = x.numel() // in_features
    functions = kernel()
    if rows > GEMV_ROWS or functions is None:
        # A slice of output rows dequantized at a time: a large-vocabulary lm_head would otherwise be a fp32 copy
        # of GBs for one call (Qwen2.5-1.5B's: 0.9 GB).
        def product(lo: int, hi: int) -> torch.Tensor:
            with _weight_scratch(hi - lo, in_features) as scratch:
                weight = dequantize(raw[lo:hi], qtype, in_features, scratch)
                return cpu_matmul.linear(x, weight, None if bias is None else bias[lo:hi])

        return by_row_slices(x, out_features, max(4, _DEQUANT_SLICE_BYTES // (4 * in_features)), product)
    flat = x.contiguous()  # [..., in] read as [M, in]
    y = torch.empty(*x.shape[:-1], out_features)  # [..., out] written as [M, out]
    args = (flat.data_ptr(), raw.data_ptr(), qtype, 0 if bias is None else bias.data_ptr(), y.data_ptr(), rows,
            in_features, out_features)
    threads = split_threads(raw.numel(), _SPLIT_BYTES)
    _check(functions.gemv(*args, 0, out_features) if threads == 1 else functions.gemv_split(*args, threads))
    return y


def _check(status: int) -> None:
    if status == -2:
        raise MemoryError("gguf_gemv: no memory for the activations' block sums")
    assert status == 0, "gguf blocks: unknown block type, or an input width that is not a multiple of 32"


class BlockLinear(nn.Module):
    """``y = x @ W.T + bias`` with W held as a GGUF tensor's blocks: ``blocks`` [out, in / block * bytes] uint8."""

    def __init__(self, blocks: torch.Tensor, qtype: int, in_features: int, bias: torch.Tensor | None) -> None:
        super().__init__()
        _, size, nbytes = BLOCK_TYPES[qtype]
        assert blocks.dtype == torch.uint8 and in_features % size == 0
        assert blocks.shape[1] == in_features // size * nbytes
        self.out_features, self.in_features, self.qtype = blocks.shape[0], in_features, qtype
        self.register_buffer("blocks", blocks)  # the name engine.models.weights_mode.weights_mode looks for
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out], in x's dtype (the model computes in fp32). Buffers read from their dicts: a
        # decode step makes ~200 of these calls, and nn.Module's attribute lookup costs more than a small GEMV.
        out = block_linear(x if x.dtype == torch.float32 else x.float(), self._buffers["blocks"], self.qtype,
                           self._parameters.get("bias"))
        return out if x.dtype == torch.float32 else out.to(x.dtype)

    def dequantized(self) -> torch.Tensor:
        """The weight this layer multiplies by, [out, in] fp32."""
        return dequantize(self.blocks, self.qtype, self.in_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"blocks={BLOCK_TYPES[self.qtype][0]}, bias={self.bias is not None}")


class TableEmbedding(nn.Module):
    """What an embedding over a block layer holds: its table (a tied lm_head's, held but not registered, since the
    blocks are the lm_head's; or its own, registered as ``rows``) and Gemma's ``embed_scale`` (``scale``)."""

    def hold_table(self, table: nn.Module, owns_table: bool, scale: torch.Tensor | None) -> None:
        if owns_table:
            self.rows = table
        else:
            self._table = (table,)
        self.scale = None if scale is None else nn.Buffer(scale.detach().clone())

    @property
    def table(self) -> nn.Module:
        rows = self._modules.get("rows")
        return rows if rows is not None else self._table[0]


class BlockEmbedding(TableEmbedding):
    """A plain embedding whose rows are a ``BlockLinear``'s: looked-up rows are dequantized. The table is a tied
    lm_head (held, not registered: the blocks belong to the lm_head, and a second registration would list them
    twice), or the embedding's own (``owns_table``: registered as ``rows``, an untied embedding's blocks). ``scale``:
    the 0-d factor a scaled embedding (Gemma's ``embed_scale``) multiplies its rows by, as it does."""

    def __init__(self, table: BlockLinear, padding_idx: int | None, owns_table: bool = False,
                 scale: torch.Tensor | None = None) -> None:
        super().__init__()
        self.hold_table(table, owns_table, scale)
        self.padding_idx = padding_idx

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized table, for code that reads ``get_input_embeddings().weight`` (built on each access)."""
        return self.table.dequantized()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # ids: [...] -> [..., hidden] fp32
        table = self.table
        rows = dequantize(table.blocks[ids.reshape(-1)], table.qtype, table.in_features)
        rows = rows.reshape(*ids.shape, table.in_features)
        return rows if self.scale is None else rows * self.scale.to(rows.dtype)


def install_gguf_blocks(model: nn.Module, tensors: Iterable[tuple]) -> dict[str, int]:
    """Replaces each fp32 ``nn.Linear`` of ``model`` whose weight is, row for row, one of ``tensors`` (its GGUF
    file's ``(info, raw)``, ``models/gguf_header.tensor_arrays``) stored in a supported block type by a
    ``BlockLinear`` over those blocks (see the module docstring); a tied lm_head's embedding becomes a
    ``BlockEmbedding``. Returns the layout: module name -> ggml type."""
    candidates: dict[tuple[int, int], list] = {}
    for info, raw in tensors:  # raw: copy-on-write maps of the file, no copies
        if info.qtype in BLOCK_TYPES and len(info.shape) == 2:  # info.shape: [in, out] (ggml's order)
            candidates.setdefault((info.shape[1], info.shape[0]), []).append((info, raw))
    layout: dict[str, int] = {}
    targets = block_targets(model)
    for name, module, ties_embedding in targets + _untied_embedding(model):
        weight = module.weight.detach()
        if weight.dtype != torch.float32:
            raise ValueError(f"gguf weights are matched against the fp32 model, and {name} is {weight.dtype}")
        layer = _LAYER.search(name)
        for info, raw in candidates.get(tuple(weight.shape), []):
            block_layer = _BLK.match(info.name)
            if (layer is None) != (block_layer is None) or (layer and layer.group(1) != block_layer.group(1)):
                continue
            blocks = _rows_matching(weight, raw, info.qtype)
            if blocks is not None:
                layer = BlockLinear(blocks, info.qtype, weight.shape[1],
                                    None if getattr(module, "bias", None) is None else module.bias.detach())
                layout[_place(model, name, module, layer, ties_embedding)] = info.qtype
                break
        trim_heap()  # the layer's dequantized scratch
    kinds = sorted({BLOCK_TYPES[qtype][0] for qtype in layout.values()})
    linear = sum(not name.endswith(_OWN_ROWS) for name in layout)
    logger.info("gguf weights: %d of %d linear layers keep the file's blocks (%s), %s; %d stay dense fp32",
                linear, len(targets), ", ".join(kinds) or "none",
                "the embedding too" if len(layout) > linear else "the embedding tied or dense", len(targets) - linear)
    return layout


def _untied_embedding(model: nn.Module) -> list[tuple[str, nn.Embedding, bool]]:
    """The input embedding as a target when it is a plain ``nn.Embedding`` of its own (an untied lm_head): its table
    is a [vocab, hidden] matrix like a linear layer's, often the model's largest."""
    embeddings = model.get_input_embeddings()
    output = model.get_output_embeddings()
    if type(embeddings) is not nn.Embedding or (output is not None and output.weight is embeddings.weight):
        return []
    if embeddings.embedding_dim % BLOCK:
        return []
    return [(name, module, False) for name, module in model.named_modules() if module is embeddings]


def _place(model: nn.Module, name: str, module: nn.Module, layer: BlockLinear, ties_embedding: bool) -> str:
    """Installs ``layer`` for ``module`` (a linear layer, or an untied embedding); returns its layout name."""
    if isinstance(module, nn.Embedding):
        model.set_submodule(name, BlockEmbedding(layer, module.padding_idx, owns_table=True))
        return f"{name}{_OWN_ROWS}"
    scale = embedding_scale(model.get_input_embeddings()) if ties_embedding else None
    install(model, name, layer, ties_embedding, functools.partial(BlockEmbedding, scale=scale))
    return name


def embedding_scale(embeddings: nn.Module) -> torch.Tensor | None:
    """The 0-d ``embed_scale`` of a scaled embedding (transformers' ``*ScaledWordEmbedding``: an ``nn.Embedding``
    whose forward multiplies its rows by it, Gemma 3's among them), else None."""
    scale = getattr(embeddings, "embed_scale", None)
    is_scaled = isinstance(embeddings, nn.Embedding) and type(embeddings).__name__.endswith("ScaledWordEmbedding")
    return scale if is_scaled and isinstance(scale, torch.Tensor) and scale.dim() == 0 else None


def _rows_matching(weight: torch.Tensor, raw: np.ndarray, qtype: int) -> torch.Tensor | None:
    """``raw``'s block rows in ``weight``'s row order when each dequantizes to exactly that row, else None. Rows in
    the file's order stay a view of ``raw`` (a map of the file); permuted ones are a copy."""
    raw_rows = torch.from_numpy(raw if raw.flags.writeable else raw.copy())
    dense = dequantize(raw_rows, qtype, weight.shape[1])
    if torch.equal(dense, weight):
        return raw_rows
    index: dict[bytes, int] = {}
    for i, row in enumerate(dense.numpy()):
        index.setdefault(row.tobytes(), i)
    order = [index.get(row.tobytes()) for row in weight.numpy()]
    if any(i is None for i in order):
        return None
    return raw_rows[torch.tensor(order)].contiguous()


def blocks_skeleton(model: nn.Module, layout: dict[str, int]) -> int:
    """Swaps in, at each ``layout`` name, a ``BlockLinear`` of the right shapes holding meta tensors: the frame for
    a model built on the meta device whose saved blocks are assigned afterwards (``engine.models.weights_cache``).
    Returns the number of layers swapped."""
    targets = {name: (module, tied) for name, module, tied in block_targets(model) + _untied_embedding(model)}
    for name, qtype in layout.items():
        owner = name[: -len(_OWN_ROWS)] if name.endswith(_OWN_ROWS) else name
        module, ties_embedding = targets[owner]  # KeyError: the saved layout is not this model's
        out_features, in_features = module.weight.shape
        _, size, nbytes = BLOCK_TYPES[qtype]
        blocks = torch.empty(out_features, in_features // size * nbytes, dtype=torch.uint8, device="meta")
        bias = None if getattr(module, "bias", None) is None else torch.empty(out_features, device="meta")
        _place(model, owner, module, BlockLinear(blocks, qtype, in_features, bias), ties_embedding)
    return len(layout)


def block_targets(model: nn.Module) -> list[tuple[str, nn.Linear, bool]]:
    """``(name, layer, ties the embedding)`` of each linear layer that could hold blocks (inputs a multiple of 32)."""
    return linear_targets(model, BLOCK, can_tie=lambda embeddings: embedding_scale(embeddings) is not None)


def block_layout(model: nn.Module) -> dict[str, int]:
    """Module name -> ggml type of each ``BlockLinear`` (what ``blocks_skeleton`` rebuilds)."""
    return {name: module.qtype for name, module in model.named_modules() if isinstance(module, BlockLinear)}
