"""Peak memory of one windowed prefill chunk's attention, before and after the ``window-blocks`` route (issue 30).

One head group of a model whose layer has a sliding window ``W``, a chunk of 4096 queries after a full window of
past keys (``W - 1 + 4096`` keys, what the schedule hands a ring layer), no flash-attn. Measured on the CPU with
torch's memory profiler: the peak bytes allocated during the call above those allocated before it, output
included (the output is the same tensor either way).

- *before*: the whole chunk through SDPA with a ``[Q, K]`` boolean mask (the route until this change);
- *after*: ``kernels.attend_span``, i.e. ``window-blocks`` (``engine/kv/windowed.py``);
- *planned*: ``windowed.scratch_bytes`` for this machine's threads, plus the output;
- *before, CUDA*: what the old CUDA route allocated, modelled as its four copies: K/V repeated for the query
  heads, the boolean mask, its additive copy in the query dtype and that copy padded to 16 keys (the H200 run
  measured 320 MiB fp32 / 176 MiB bf16 for the Mistral shape: ``docs/benchmarks/gpu-h200.md``).

    .venv/bin/python -m benchmarks.gpu.windowed_attention
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from engine.kv import kernels, windowed

OUT = Path("docs/benchmarks/windowed-attention.md")
MIB = 2**20


@dataclass(frozen=True)
class GroupShape:
    """One head group (g = 1 KV head) of a windowed layer."""

    name: str
    num_q_heads: int
    head_dim: int
    window: int


SHAPES = (
    GroupShape("Mistral-7B v0.1 (32 q / 8 kv heads)", 4, 128, 4096),
    GroupShape("Gemma 3 12B (16 q / 8 kv heads)", 2, 256, 1024),
    GroupShape("Gemma 3 1B (4 q / 1 kv head)", 4, 256, 512),
)


def peak_extra_bytes(fn) -> tuple[int, object]:
    """(peak CPU bytes allocated while ``fn()`` runs above what was allocated before it, ``fn()``'s result),
    from the allocation and free events of torch's memory profiler, in the order they happened."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = sorted((event.start_ns(), event.nbytes()) for event in prof.profiler.kineto_results.events()
                    if event.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak, result


def whole_chunk_mask(query, block, q_offset, scaling, window):
    """The route before ``window-blocks``: SDPA over every key with a [Q, K] boolean mask."""
    keys, values = block.permute(2, 1, 3, 0, 4).unbind(0)  # [B, Hk, K, D]
    q_pos = torch.arange(query.shape[2])[:, None] + q_offset
    k_pos = torch.arange(keys.shape[2])[None, :]
    mask = (k_pos <= q_pos) & (k_pos > q_pos - window)
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=scaling,
                                          enable_gqa=query.shape[1] > keys.shape[1])


def old_cuda_bytes(shape: GroupShape, chunk: int, dtype_bytes: int) -> int:
    """The old CUDA route's peak: its four copies alive at once (the unpadded additive copy is freed before the
    kernel allocates the output). Gives the H200's 320 / 176 MiB for the Mistral shape."""
    keys = shape.window - 1 + chunk
    repeated = 2 * shape.num_q_heads * keys * shape.head_dim * dtype_bytes
    padded = -(-keys // 16) * 16
    return repeated + chunk * keys + chunk * keys * dtype_bytes + chunk * padded * dtype_bytes


def measure(shape: GroupShape, dtype: torch.dtype, chunk: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, shape.num_q_heads, chunk, shape.head_dim, generator=generator).to(dtype)
    block = torch.randn(shape.window - 1 + chunk, 1, 2, 1, shape.head_dim, generator=generator).to(dtype)
    args = dict(q_offset=shape.window - 1, scaling=shape.head_dim**-0.5)
    row = {"shape": shape.name, "dtype": str(dtype).removeprefix("torch.")}
    for label, fn in (("before", lambda: whole_chunk_mask(query, block, window=shape.window, **args)),
                      ("after", lambda: kernels.attend_span(query, block, window=shape.window, **args))):
        start = time.perf_counter()
        row[label], out = peak_extra_bytes(fn)
        row[f"{label}_s"] = time.perf_counter() - start
        row.setdefault("reference", out)
    row["max_diff"] = float((out.float() - row.pop("reference").float()).abs().max())
    scratch = windowed.scratch_bytes(1, shape.num_q_heads, 1, shape.head_dim, shape.window, chunk,
                                     query.element_size(), cuda=False, cpu_threads=torch.get_num_threads())
    row["planned"] = scratch + out.nbytes
    row["planned_cuda"] = windowed.scratch_bytes(1, shape.num_q_heads, 1, shape.head_dim, shape.window, chunk,
                                                 query.element_size(), cuda=True) + out.nbytes
    row["old_cuda"] = old_cuda_bytes(shape, chunk, query.element_size())
    return row


def table(rows: list[dict], chunk: int) -> str:
    lines = [f"Chunk {chunk}, one head group (1 KV head), {torch.get_num_threads()} CPU threads, torch "
             f"{torch.__version__}. Peak bytes of one call above those allocated before it, output included.", "",
             "| shape | dtype | before (CPU) | after (CPU) | planned (CPU) | before, CUDA (model) | planned (CUDA) | "
             "before s | after s | max abs diff |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['shape']} | {row['dtype']} | {row['before'] / MIB:.1f} MiB | {row['after'] / MIB:.1f} MiB"
                     f" | {row['planned'] / MIB:.1f} MiB | {row['old_cuda'] / MIB:.1f} MiB"
                     f" | {row['planned_cuda'] / MIB:.1f} MiB | {row['before_s']:.2f} | {row['after_s']:.2f}"
                     f" | {row['max_diff']:.1e} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    rows = [measure(shape, dtype, args.chunk) for shape in SHAPES for dtype in (torch.float32, torch.bfloat16)]
    text = table(rows, args.chunk)
    print(text)
    args.out.write_text(_HEADER + text + "\n")


_HEADER = """# Windowed attention: peak memory of one prefill chunk (issue 30, finding 4)

Without flash-attn, a sliding-window chunk used to go to SDPA whole, with a `[Q, K]` boolean mask: torch converts
it to an additive copy in the query dtype, and on CUDA the memory-efficient kernel (the only fused one that takes
a mask) pads that copy to 16 keys and needs K/V repeated for GQA. The first H200 run (`gpu-h200.md`,
`test_windowed_gqa_prefill_chunk_runs_a_fused_kernel_without_a_score_tensor`) measured 320 MiB (fp32) and
176 MiB (bf16) for the Mistral shape below, none of it in the plan. The `window-blocks` route
(`engine/kv/windowed.py`) attends blocks of queries against the keys they can see, with a mask of
`[n_rep * block, keys]` in the query dtype (at most `windowed.MASK_BYTES` = 8 MiB), query heads folded onto their
KV head; the planner counts `windowed.scratch_bytes`.

`python -m benchmarks.gpu.windowed_attention` (CPU, torch's memory profiler). "before, CUDA (model)" adds up the old
CUDA route's four copies (repeated K/V, boolean mask, additive copy, padded copy), alive at once before the
output is allocated: for Mistral it gives the H200's 320 / 176 MiB exactly. "planned (CUDA)" is what the plan
counts for the new route on CUDA (it adds the block's K/V made contiguous and an fp32 output accumulator, and
drops the CPU kernel's per-thread buffers), output included. No GPU has run the new route yet: the GPU test
`test_windowed_gqa_prefill_chunk_runs_a_fused_kernel_without_a_score_tensor` now also checks the peak against it.
The seconds are one call each on a 2-core machine shared with other jobs: indicative only (a block computes the
scores of at most `W + block - 1` keys per query, the whole chunk computed `W + Q - 1`).

"""


if __name__ == "__main__":
    main()
