"""Two or more builds of the host attention kernel (``host_kernel.c`` compiled with other ``-D`` flags), one layer's
decode call each, in turns.

A kernel change that moves a figure by a few percent is only seen in turns: this VM's memory bandwidth moves with
other tenants by more than that between two runs. Each build is its own library (``native.build``); in every round
each build's call follows a 1 GiB read (so its layer comes from DRAM, as a decode step's does) and which build goes
first alternates (ABBA); the read is timed in the same rounds. Medians::

    .venv/bin/python -m benchmarks.cpu.host_builds --build before=-DHA_ROWS6=0 --build now= \\
        --shape qwen2.5-1.5b --dtypes fp32,int8 --tokens 8K,32K,128K --out docs/benchmarks/data/host-rows6.json

Shapes as ``host_prefetch``'s: ``llama3-8b`` (8 groups of one KV head, 4 query rows each, bf16 queries) and
``qwen2.5-1.5b`` (the CPU default model's decode step: one group of 2 KV heads, 6 query rows each).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from engine.kv import native
from engine.native.library import compiler

from ..records import IN_TURNS, ResultStore, load_records, machine_line, run_stamp
from ..harness.layout import cited, report_of
from .host_attention import Layer, Read, in_turns, turns_table
from .host_prefetch import SHAPES
from ..harness.run import parse_tokens


def parse_build(text: str) -> tuple[str, list[str]]:
    """``name=FLAG FLAG ...`` (flags may be empty: the source's defaults) -> (name, flags)."""
    name, _, flags = text.partition("=")
    if not name:
        raise argparse.ArgumentTypeError(f"a build is NAME=FLAGS, got {text!r}")
    return name, flags.split()


def measure(kernels: dict, shape: str, dtypes: list[str], tokens: list[int], threads: list[int], rounds: int,
            store: ResultStore, read_bytes: int = 1 << 30) -> None:
    read = Read(read_bytes)
    for dtype in dtypes:
        for count in tokens:
            layer = Layer(count, dtype, **SHAPES[shape])
            for num_threads in threads:
                in_turns(layer, {name: {"function": function} for name, function in kernels.items()}, read,
                         num_threads, rounds, store, shape, dtype)


def write_markdown(records: list[dict], builds: dict[str, list[str]], path: Path) -> None:
    names = list(builds)
    stamp = records[-1]["run"] if records else {}
    flags = ", ".join(f"**{name}** `{' '.join(f) or '(the source as it is)'}`" for name, f in builds.items())
    lines = ["# Host attention: builds in turns (CPU)", "",
             f"`python -m benchmarks.cpu.host_builds` (raw records: `{cited(path, report_of(path))}`). "
             f"Builds of `engine/kv/host_kernel.c`: {flags}. One layer's decode call each, in turns in every round "
             "(which goes first alternates), each after a 1 GiB read; the read timed in the same rounds. Medians. "
             "Shapes: `llama3-8b`, 8 groups of one KV head, 4 query rows each, bf16 queries; `qwen2.5-1.5b`, the "
             "CPU default model's: one group of 2 KV heads, 6 query rows each.", "",
             machine_line(stamp, IN_TURNS), "",
             *turns_table(records, names)]
    report_of(path).write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu.host_builds",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--build", type=parse_build, action="append", required=True,
                        help="NAME=FLAGS, once per build (the first is the baseline of the ratios)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    parser.add_argument("--dtypes", default="fp32", help="home dtypes, comma-separated (fp32, bf16, int8)")
    parser.add_argument("--tokens", default="8K,32K,128K")
    parser.add_argument("--threads", default="1,0", help="threads per call, comma-separated (0: every core)")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--read-mib", type=int, default=1024, help="size of the read buffer")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    builds = dict(args.build)
    if len(builds) < 2:
        parser.error("give at least two builds")
    if not args.report_only:
        kernels = {name: native.build(compiler(), flags) for name, flags in builds.items()}
        missing = [name for name, function in kernels.items() if function is None]
        if missing:
            parser.error(f"these builds failed: {', '.join(missing)} (the log says why)")
        store = ResultStore(args.out, run_stamp("cpu"))
        measure(kernels, args.shape, args.dtypes.split(","), parse_tokens(args.tokens),
                [int(t) for t in args.threads.split(",")], args.rounds, store, args.read_mib << 20)
    write_markdown(load_records(args.out), builds, args.out)


if __name__ == "__main__":
    main()
