"""The host attention kernel's prefetch level for bf16/fp16/fp32 homes: the next tokens' lines requested into L1
(``l1``, prefetcht0) or into L2 and below only (``l2``, prefetcht2), on one thread and on every core, in turns.

``host_kernel.c`` requests a head's keys (values) 8 KiB ahead as it scores (adds) each token. A request into L1
holds one of the core's few line-fill buffers until the line arrives, and the kernel's own loads wait for those same
buffers; a request into L2 queues in L2's larger miss queue and the line moves to L1 on the demand load. Which is
faster depends on the core: on the 2-vCPU VM of 2026-11-27 ``l2`` was 4-10% faster for bf16 homes, on the Zen 5
EPYC VM ``l1`` was (fp32 homes 14-35%); ``auto`` (``host_pool.c``) is ``l1`` on AMD, ``l2`` elsewhere, and
``HEADINFER_HOST_PREFETCH`` forces one. int8 homes always request into L1 (``HA_PREFETCH_HINT_INT8``): their rows
run the same code at both levels, the noise of two turns.

Cases: a Llama-3-8B layer (8 groups of one KV head, 4 query rows each, bf16 queries: a bf16 model's, scored by bf16
dot products where the CPU has them) and the CPU default model's (Qwen2.5-Coder-1.5B: one group of 2 KV heads, 6
query rows each, fp32 homes and queries). The levels take turns in every round (which goes first alternates), each
call after a 1 GiB read so that its layer comes from DRAM as a decode step's does; the read is timed in the same
rounds:

    .venv/bin/python -m benchmarks.cpu.host_prefetch

Writes ``docs/benchmarks/host-prefetch.md`` and ``data/host-prefetch.json``. The results are the same operations in the same order at
both levels: only when the lines arrive differs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from engine.kv import native

from ..records import IN_TURNS, ResultStore, load_records, machine_line, run_stamp
from ..harness.layout import cited, report_of
from .host_attention import LLAMA3_8B, Layer, Read, in_turns, turns_table

OUT = Path("docs/benchmarks/data/host-prefetch.json")
LEVELS = ("l1", "l2")
QWEN_1_5B = {"num_groups": 1, "group": 2, "n_rep": 6, "head_dim": 128}  # the CPU default model's decode step
SHAPES = {"llama3-8b": LLAMA3_8B, "qwen2.5-1.5b": QWEN_1_5B}
#: (shape, home dtype, tokens per group)
CASES = [("llama3-8b", "bf16", 32768), ("llama3-8b", "bf16", 131072), ("qwen2.5-1.5b", "fp32", 8192),
         ("qwen2.5-1.5b", "fp32", 32768), ("llama3-8b", "int8", 32768)]


def measure(cases: list, threads: list[int], rounds: int, store: ResultStore, read_bytes: int = 1 << 30) -> None:
    read = Read(read_bytes)
    for shape, dtype, tokens in cases:
        layer = Layer(tokens, dtype, **SHAPES[shape])
        for num_threads in threads:
            in_turns(layer, {level: {"prefetch": level} for level in LEVELS}, read, num_threads, rounds, store,
                     shape, dtype)


def write_markdown(records: list[dict], path: Path) -> None:
    stamp = records[-1]["run"] if records else {}
    function = native.kernel()
    auto = function.prefetch(native.PREFETCH["auto"]) if function is not None else None
    lines = ["# Host attention: the prefetch level (CPU)", "",
             f"`python -m benchmarks.cpu.host_prefetch` (raw records: `{cited(path, report_of(path))}`). One layer's decode "
             "call with the next tokens' lines requested into **L1** (prefetcht0) or into **L2** and below "
             "(prefetcht2), the two levels in turns in every round (which goes first alternates), each call after a "
             "1 GiB read; the read is timed in the same rounds. Medians. int8 homes request into L1 at both levels: "
             "their rows are the same code twice, the noise of two turns. Shapes: `llama3-8b`, 8 groups of one KV "
             "head, 4 query rows each, bf16 queries (scored by bf16 dot products where the CPU has them); "
             "`qwen2.5-1.5b`, the CPU default model's: one group of 2 KV heads, 6 query rows each, fp32.", "",
             machine_line(stamp, IN_TURNS) + (f" `auto` on this CPU: {'L1' if auto == 1 else 'L2'}." if auto else ""),
             "",
             *turns_table(records, ["l2", "l1"])]  # l1 / l2: the time requesting into L1 takes of L2's
    report_of(path).write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu.host_prefetch",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", default="1,0", help="threads per call, comma-separated (0: every core)")
    parser.add_argument("--tokens", type=int, default=0, help="tokens of every case (tests: small); 0: each its own")
    parser.add_argument("--read-mib", type=int, default=1024, help="size of the read buffer")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    if not args.report_only:
        cases = [(shape, dtype, args.tokens or tokens) for shape, dtype, tokens in CASES]
        store = ResultStore(args.out, run_stamp("cpu"))
        measure(cases, [int(t) for t in args.threads.split(",")], args.rounds, store, args.read_mib << 20)
    write_markdown(load_records(args.out), args.out)


if __name__ == "__main__":
    main()
