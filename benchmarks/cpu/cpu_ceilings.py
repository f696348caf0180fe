"""What one core can compute at most, against what issue 29's CPU targets ask of it (one thread).

Two of the issue's CPU targets are open on one thread: host attention at >= 0.7x the read for int8 (and bf16) homes
(item 2) and prefill at >= 1.0x llama.cpp (item 5). This measures the ceilings they meet, on this thread:

- **arithmetic**: 512-bit fused multiply-adds per second with no loads (``cpu_ceilings.c``), bf16 dot products
  (vdpbf16ps) likewise, and an fp32 GEMM micro-kernel's GFLOPS over panels in L1 (the pace no fp32 GEMM beats);
- **host attention without memory**: one KV head's decode call over a home that fits in L2, ns per token and KV
  head (the difference of two lengths, so the call's fixed cost drops out), for the Llama-3-8B layer's bf16 and
  int8 homes and the CPU default model's fp32 one; against the time a token and KV head may take at 0.7x the read.
  Where the arithmetic alone takes longer, no prefetching reaches 0.7x (``overlap.md``: here a core computes and
  waits for memory in turn, so the arithmetic's time adds to the read's);
- **prefill products**: oneDNN's fp32 GFLOPS on one core at the CPU default model's chunk shapes (512 tokens), and
  the seconds a 2,048-token read's products (weights and attention) take at that rate, at the micro-kernel's, and
  at the arithmetic peak, against llama.cpp's whole 2K prefill on one core (``docs/benchmarks/data/llamacpp-1.5b-epyc.json``).

    taskset -c 0 .venv/bin/python -m benchmarks.cpu.cpu_ceilings

Writes ``docs/benchmarks/cpu-ceilings.md`` and ``data/cpu-ceilings.json``.
"""

from __future__ import annotations

import argparse
import ctypes
from pathlib import Path

import torch

from engine.kv import native
from engine.cpu import cpu_matmul
from engine.native.library import compiler, load_library

from .host_attention import LLAMA3_8B, Layer, Read
from .host_prefetch import QWEN_1_5B
from ..harness.timing import median_seconds
from ..harness.layout import cited, report_of
from ..records import ResultStore, load_records, machine_line, run_stamp
from ..weights import llamacpp_1_5b

SOURCE = Path(__file__).with_name("cpu_ceilings.c")
OUT = Path("docs/benchmarks/data/cpu-ceilings.json")
TARGET_X_READ = 0.7
#: Qwen2.5-Coder-1.5B-Instruct (the CPU default): its GGUF's shapes
QWEN = {"hidden": 1536, "intermediate": 8960, "layers": 28, "heads": 12, "kv_heads": 2, "head_dim": 128}
CHUNK, READ_TOKENS = 512, 2048
#: host attention cases: (name, Layer shape of one group, home dtype, two lengths whose homes fit in L2)
ATTENTION = [("llama3-8b bf16", {**LLAMA3_8B, "num_groups": 1}, "bf16", (1024, 2048)),
             ("llama3-8b int8", {**LLAMA3_8B, "num_groups": 1}, "int8", (1024, 2048)),
             ("qwen2.5-1.5b fp32", QWEN_1_5B, "fp32", (256, 512))]


def product_shapes(model: dict = QWEN, tokens: int = CHUNK) -> list[tuple[int, int, int]]:
    """(M, K, N) of one layer's weight products for a chunk of ``tokens``: q, k, v, o, gate, up, down."""
    h, i, kv = model["hidden"], model["intermediate"], model["kv_heads"] * model["head_dim"]
    return [(tokens, h, h), (tokens, h, kv), (tokens, h, kv), (tokens, h, h), (tokens, h, i), (tokens, h, i),
            (tokens, i, h)]


def read_flops(model: dict = QWEN, tokens: int = READ_TOKENS) -> dict[str, float]:
    """FLOPs of reading ``tokens`` (causal): the weights' products (no lm_head: a read keeps one row of logits) and
    attention's two products."""
    weights = sum(2 * k * n for _, k, n in product_shapes(model, 1)) * tokens * model["layers"]
    attention = 2 * 2 * model["heads"] * model["head_dim"] * tokens * (tokens + 1) / 2 * model["layers"]
    return {"weights": weights, "attention": attention}


def _library():
    cc = compiler()
    library = load_library(cc, SOURCE, [[]]) if cc else None
    if library is None:
        raise SystemExit("no C compiler, or cpu_ceilings.c does not build here")
    for name in ("cc_fma_rate", "cc_dpbf16_rate"):
        getattr(library, name).argtypes, getattr(library, name).restype = [ctypes.c_long], ctypes.c_double
    library.cc_gemm_l1.argtypes, library.cc_gemm_l1.restype = [ctypes.c_long], ctypes.c_double
    return library


def measure_arithmetic(store: ResultStore, scale: float = 1.0) -> None:
    library = _library()
    steps, calls = max(1000, int(2e8 * scale)), max(100, int(2e5 * scale))
    rates = {"fma": max(library.cc_fma_rate(steps) for _ in range(3)),
             "dpbf16": max(library.cc_dpbf16_rate(steps) for _ in range(3)),
             "gemm_l1_gflops": max(library.cc_gemm_l1(calls) for _ in range(3))}
    for name, value in rates.items():
        print(f"{name}: {value / (1 if name.endswith('gflops') else 1e9):.2f}", flush=True)
        store.append("arithmetic", name, value=value)


def _heads(shape: dict) -> int:
    """KV heads of a Layer shape (its groups times their heads)."""
    return shape.get("group", 1) * shape["num_groups"]


def measure_attention(store: ResultStore, repeats: int = 300, read_bytes: int = 1 << 30) -> None:
    read = Read(read_bytes)
    read_gbps = read.data.nbytes / median_seconds(lambda: read.call(1), "cpu", warmup=0, repeats=5)[0] / 1e9
    for name, shape, dtype, (short, long_) in ATTENTION:
        seconds, per_token_head = [], 0.0
        for tokens in (short, long_):
            layer = Layer(tokens, dtype, **shape)
            # the 10th percentile (the nearest to a quiet core), after a call that touches the pages and fills L2
            _, samples = median_seconds(lambda: layer.call(1), "cpu", repeats=repeats)
            seconds.append(sorted(samples)[len(samples) // 10])
            per_token_head = layer.home_bytes / (tokens * _heads(shape))
        ns = (seconds[1] - seconds[0]) / ((long_ - short) * _heads(shape)) * 1e9
        budget = per_token_head / (TARGET_X_READ * read_gbps)  # ns a token and KV head may take at 0.7x the read
        print(f"{name}: {ns:.2f} ns a token and KV head from L2; {per_token_head:.0f} B; budget at "
              f"{TARGET_X_READ}x the read ({read_gbps:.1f} GB/s): {budget:.2f} ns", flush=True)
        store.append("attention", name, ns=ns, bytes=per_token_head, read_gbps=read_gbps, budget_ns=budget,
                     path=_path_name())


def _path_name() -> str | None:
    """The host kernel's vector path on this CPU (``auto``'s pick), by name."""
    function = native.kernel()
    if function is None:
        return None
    chosen = function.variant(native.PATHS["auto"])
    return next((name for name, code in native.PATHS.items() if code == chosen and name != "auto"), str(chosen))


def measure_products(store: ResultStore, repeats: int = 7) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for m, k, n in sorted(set(product_shapes())):
            x, w = torch.randn(m, k), torch.randn(n, k)
            seconds, _ = median_seconds(lambda: cpu_matmul.linear(x, w), "cpu", repeats=repeats)
            gflops = 2 * m * k * n / seconds / 1e9
            print(f"[{m}, {k}] x [{k}, {n}]: {gflops:.0f} GFLOPS", flush=True)
            store.append("products", _name(m, k, n), gflops=gflops, onednn=cpu_matmul.uses_onednn())
    finally:
        torch.set_num_threads(threads)


def _name(m: int, k: int, n: int) -> str:
    return f"[{m}, {k}] x [{k}, {n}]"


def write_markdown(records: list[dict], path: Path, llamacpp_s: float | None) -> None:
    latest: dict[tuple[str, str], dict] = {}
    for record in records:
        latest[(record["phase"], record["mode"])] = record["metrics"]
    stamp = records[-1]["run"] if records else {}
    lines = ["# One core's ceilings against issue 29's CPU targets", "",
             f"`taskset -c 0 python -m benchmarks.cpu.cpu_ceilings` (raw records: `{cited(path, report_of(path))}`). One "
             "thread throughout.", "", machine_line(stamp), ""]
    arithmetic = {mode: m["value"] for (phase, mode), m in latest.items() if phase == "arithmetic"}
    if arithmetic:
        fma = arithmetic.get("fma", -1)
        lines += ["## Arithmetic", "",
                  "| what | rate | fp32 GFLOPS |", "|---|---:|---:|",
                  f"| 512-bit FMAs, 12 chains in registers | {fma / 1e9:.2f} G/s | {fma * 32 / 1e9:.0f} |",
                  f"| vdpbf16ps, 12 chains in registers | {arithmetic.get('dpbf16', -1) / 1e9:.2f} G/s | - |",
                  f"| fp32 GEMM micro-kernel (12 x 32 tile), panels in L1 | - | "
                  f"{arithmetic.get('gemm_l1_gflops', -1):.0f} |", ""]
    attention = [(mode, m) for (phase, mode), m in latest.items() if phase == "attention"]
    if attention:
        lines += ["## Host attention with memory taken away", "",
                  "One KV head's decode call over a home in L2 (the difference of two lengths: the fixed cost drops "
                  f"out). **Budget**: the time a token and KV head may take at {TARGET_X_READ}x the read. **At most**: "
                  "the ratio to the read if reading cost nothing (bytes / arithmetic time / read); the kernel meets "
                  f"{TARGET_X_READ}x only where this is well above it, as computing and reading add up on this core "
                  "(`overlap.md`).", "",
                  "| home | path | bytes a token and KV head | arithmetic ns | budget ns | read GB/s | at most x read |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for mode, m in attention:
            at_most = f"{m['bytes'] / m['ns'] / m['read_gbps']:.2f}" if m["ns"] > 0 else "-"  # a noisy tiny run
            lines.append(f"| {mode} | {m.get('path')} | {m['bytes']:.0f} | {m['ns']:.2f} | {m['budget_ns']:.2f} | "
                         f"{m['read_gbps']:.1f} | {at_most} |")
        lines.append("")
    products = {mode: m["gflops"] for (phase, mode), m in latest.items() if phase == "products"}
    layer = [(k, n, products.get(_name(CHUNK, k, n))) for _, k, n in product_shapes(QWEN, 1)]
    if products and all(rate for _, _, rate in layer):
        flops = read_flops()
        total = sum(flops.values())
        # the layer's products at their own rates: total FLOPs over total seconds
        weighted = sum(k * n for k, n, _ in layer) / sum(k * n / rate for k, n, rate in layer)
        lines += ["## Prefill: the products of a 2K read", "",
                  "| product (one core, 512 tokens) | GFLOPS |", "|---|---:|"]
        lines += [f"| {mode} | {rate:.0f} |" for mode, rate in products.items()]
        lines += ["", f"A {READ_TOKENS:,}-token read of the CPU default model: {flops['weights'] / 1e12:.2f} TFLOP of "
                  f"weight products and {flops['attention'] / 1e12:.2f} of attention (causal), {total / 1e12:.2f} in "
                  "all.", "", "| at | GFLOPS | products' seconds | at most x llama.cpp (nothing else taking time) | "
                  "seconds left to tie for the rest of a read |", "|---|---:|---:|---:|---:|"]
        paces = [("oneDNN, weighted over the layer's products", weighted)]
        if arithmetic.get("gemm_l1_gflops", -1) > 0:
            paces.append(("the micro-kernel in L1", arithmetic["gemm_l1_gflops"]))
        if arithmetic.get("fma", -1) > 0:
            paces.append(("the FMA peak", arithmetic["fma"] * 32 / 1e9))
        for name, gflops in paces:
            seconds = total / (gflops * 1e9)
            lines.append(f"| {name} | {gflops:.0f} | {seconds:.1f} | "
                         f"{'-' if llamacpp_s is None else f'{llamacpp_s / seconds:.2f}'} | "
                         f"{'-' if llamacpp_s is None else f'{llamacpp_s - seconds:.1f}'} |")
        if llamacpp_s is not None:
            lines += ["", f"llama.cpp reads the same 2,048 tokens in {llamacpp_s:.1f} s on one core "
                      f"(`{llamacpp_1_5b.EPYC.name}`), multiplying 8-bit integers (VNNI: four times the multiply-adds of an "
                      "fp32 FMA per instruction). A read's other work (dequantizing the weights, norms, rotary "
                      "embedding, softmax, the KV cache) comes on top of its products: to tie, it must fit in the "
                      "last column's seconds."]
    report_of(path).write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu.cpu_ceilings",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the arithmetic loops (tests: small)")
    parser.add_argument("--repeats", type=int, default=300, help="timed calls per host attention length")
    parser.add_argument("--read-mib", type=int, default=1024)
    parser.add_argument("--skip-products", action="store_true", help="no oneDNN products (tests)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    if not args.report_only:
        store = ResultStore(args.out, run_stamp("cpu"))
        measure_arithmetic(store, args.scale)
        measure_attention(store, args.repeats, args.read_mib << 20)
        if not args.skip_products:
            measure_products(store)
    write_markdown(load_records(args.out), args.out, llamacpp_1_5b.prefill_seconds(llamacpp_1_5b.EPYC))


if __name__ == "__main__":
    main()
