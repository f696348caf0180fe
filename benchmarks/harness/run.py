"""``python -m benchmarks.harness.run``: the benchmark entry point (the method: docs/benchmarks/method.md).

GPU (CUDA, Llama-3-8B-shaped random bf16 weights under an emulated budget), pieces chosen by flags::
    python -m benchmarks.harness.run --phases ceilings
    python -m benchmarks.harness.run --phases prefill --modes standard,headinfer-adaptive --lengths 1K,10K,20K,40K --resume
    python -m benchmarks.harness.run --phases decode,max-context,peak,profile --time-limit 300 --resume
    python -m benchmarks.harness.run --report-only

CPU smoke (SmolLM2 on CPU, stock vs head-wise vs ping-pong, a few minutes)::
    python -m benchmarks.harness.run --cpu-smoke
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import psutil
import torch

from engine.planning.budgets import card_budget
from engine.planning.gpu_ids import indexed

from .ceilings import measure_all
from .junit import summarize_junit
from .hybrid import HYBRID_MODELS
from .models import build_model
from .modes import GPU_MODES, SMOKE_MODES, Runner, parse_modes
from .probes import warm_up
from ..records import ResultStore, load_records, run_stamp
from .layout import data_file, data_folder
from .report import write_markdown, write_plots
from .smoke import run_smoke, write_report
from .sweeps import Sweep
from .timing import cuda_context_bytes, quick_collections

PHASES = ("ceilings", "decode", "prefill", "max-context", "peak", "profile")
_SUFFIX = {"K": 1 << 10, "M": 1 << 20}


def parse_tokens(text: str) -> list[int]:
    """``"1K,10K,1M,300"`` -> token counts (K = 1024, M = 1024^2)."""
    values = []
    for item in filter(None, (t.strip().upper() for t in text.split(","))):
        scale = _SUFFIX.get(item[-1], 1)
        values.append(int(float(item[:-1] if scale > 1 else item) * scale))
    return values


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.harness.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-smoke", action="store_true", help="run the CPU variant and exit")
    p.add_argument("--smoke-model", default="smollm2", choices=("smollm2", "tiny"),
                   help="CPU smoke model: the embedded SmolLM2, or a tiny random Llama (tests)")
    p.add_argument("--phases", default="ceilings,decode,prefill,max-context,peak,profile",
                   help=f"comma list of {', '.join(PHASES)}")
    p.add_argument("--modes", default="all", help="comma list of modes, 'headinfer' for all head-wise ones, or 'all'")
    p.add_argument("--lengths", default=None, help="prefill lengths, e.g. 1K,10K,20K,40K,100K,200K,400K "
                   "(CPU smoke: 512,2048)")
    p.add_argument("--decode-lengths", default="1K,16K,64K,128K,256K,512K",
                   help="decode cache capacities (powers of two keep the layer-wise baseline's pinned blocks unpadded)")
    p.add_argument("--peak-lengths", default="32K,64K,128K,256K,512K")
    p.add_argument("--peak-modes", default="headinfer-g1,headinfer-adaptive")
    p.add_argument("--max-context-limit", default="4M", help="largest context the max-context search tries")
    p.add_argument("--profile-mode", default="headinfer-g1")
    p.add_argument("--profile-context", default="128K")
    p.add_argument("--budget-gib", type=float, default=24.0, help="emulated GPU memory (0: the whole GPU)")
    p.add_argument("--chunk-size", type=int, default=None, help="prefill chunk (GPU 4096, CPU smoke 512)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats (median); long runs stop earlier")
    p.add_argument("--decode-steps", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="CPU smoke: torch threads (1 is steadiest on a busy "
                   "machine: spinning threads lose their time slices)")
    p.add_argument("--time-limit", type=float, default=540.0, help="seconds per piece (one phase x one mode)")
    p.add_argument("--budget-s", type=float, default=None, help="seconds for this whole process")
    p.add_argument("--out", default="docs/benchmarks", help="folder for the markdown (JSON and plots in its data/ where it has one)")
    p.add_argument("--name", default=None, help="results file stem (default gpu, or cpu-smoke)")
    p.add_argument("--resume", action="store_true", help="skip measurements already in the results JSON")
    p.add_argument("--report-only", action="store_true", help="rewrite markdown and plots from the JSON")
    p.add_argument("--record-junit", default=None, help="append a parity record from a pytest --junitxml file")
    p.add_argument("--suite", default="pytest -m gpu", help="name of the --record-junit suite")
    p.add_argument("--is-done", default=None, help="exit 0 if this phase already has a final record, else 1")
    p.add_argument("--device", default="cuda", help="cuda, or cpu to run the GPU pieces on a tiny model (tests)")
    p.add_argument("--model", default="llama3-8b", choices=("llama3-8b", "tiny", *HYBRID_MODELS))
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with quick_collections():
        return _main(args)


def _main(args) -> int:
    out = Path(args.out)
    if args.cpu_smoke and args.report_only:
        name = args.name or "cpu-smoke"
        write_report(load_records(data_file(out, f"{name}.json")), out, name)
        return 0
    if args.cpu_smoke:
        return _cpu_smoke(args, out)

    name = args.name or "gpu"
    results = data_file(out, f"{name}.json")
    if args.report_only:
        _report(load_records(results), out, name)
        return 0
    stamp = run_stamp(args.device)
    store = ResultStore(results, stamp)
    if args.is_done:
        return 0 if store.latest(args.is_done) is not None else 1
    if args.record_junit:
        store.append("parity", args.suite, status="ok", **summarize_junit(args.record_junit))
        _report(store.records, out, name)
        return 0
    _run_gpu(args, store, out, name)
    _report(store.records, out, name)
    return 0


def _run_gpu(args, store, out: Path, name: str) -> None:
    device = torch.device(args.device)
    deadline = None if args.budget_s is None else time.monotonic() + args.budget_s
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(phases) - set(PHASES)
    if unknown:
        raise SystemExit(f"unknown phases {sorted(unknown)}; choose from {PHASES}")
    is_cuda = device.type == "cuda"
    if is_cuda and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: run the GPU pieces on a GPU machine, or --cpu-smoke here")
    budget = int(args.budget_gib * (1 << 30)) if is_cuda and args.budget_gib else None
    budget_gib = args.budget_gib if budget else None
    if "ceilings" in phases and is_cuda and not (args.resume and store.latest("ceilings")):
        store.append("ceilings", None, **measure_all())  # before the model: nothing else on the GPU
    if set(phases) <= {"ceilings"}:
        return
    if (store.stamp.get("model") or {}).get("name") != args.model:  # what --resume looks for is this model's
        store.stamp["model"] = {"name": args.model}
    modes = parse_modes(args.modes, GPU_MODES)
    if not is_cuda:  # transformers' offloading cache needs CUDA streams
        modes = [m for m in modes if m.kind != "layerwise"]
    lengths = parse_tokens(args.lengths or "1K,10K,20K,40K,100K,200K,400K")
    sweep = Sweep(None, store, budget_gib=budget_gib, time_limit=args.time_limit, deadline=deadline,
                  resume=args.resume, repeats=args.repeats, decode_steps=args.decode_steps)
    work = {"prefill": (modes, lengths), "decode": (modes, parse_tokens(args.decode_lengths)),
            "peak": (parse_modes(args.peak_modes, GPU_MODES), parse_tokens(args.peak_lengths)),
            "max-context": (modes, None), "profile": ([GPU_MODES[args.profile_mode]],
                                                      parse_tokens(args.profile_context))}
    phases = [p for p in phases if p in work and sweep.pending(p, *work[p])]
    if not phases:
        logging.getLogger(__name__).info("nothing left to measure in this piece")
        return
    context = None
    if is_cuda:
        context = store.stamp["cuda_context_bytes"] = cuda_context_bytes(device)  # before the model: ours alone
    card = indexed(device) if is_cuda else None  # torch 2.11 refuses torch.device("cuda") in the fraction call
    if budget:  # the 27B hybrid is built in bf16 and quantized a layer at a time: past the budget until it is done
        torch.cuda.set_per_process_memory_fraction(1.0, card)
    model = _built_model(args.model, device)
    if budget:
        total = torch.cuda.get_device_properties(card).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), card)
    ceilings = store.latest("ceilings")
    sweep.runner = Runner(model, device, chunk_size=args.chunk_size or 4096,
                          gpu_budget=card_budget(budget, context_bytes=context) if budget else None,
                          host_budget=_host_budget(ceilings) if is_cuda else None, cuda_context_bytes=context)
    runner = sweep.runner
    store.stamp["model"] = runner.describe(args.model)
    if ceilings and ceilings["metrics"].get("matmul_tflops"):
        sweep.flops_per_second = 0.5 * ceilings["metrics"]["matmul_tflops"] * 1e12  # pessimistic, for probe choice
    for phase in phases:
        if deadline is not None and time.monotonic() >= deadline:
            logging.getLogger(__name__).info("time budget spent before %s", phase)
            break
        phase_modes, phase_lengths = work[phase]
        if phase in ("decode", "prefill"):
            for mode in phase_modes:  # kernels chosen and allocators warm before anything is timed
                if sweep.pending(phase, [mode], phase_lengths):
                    warm_up(runner, mode)
        if phase == "decode":
            sweep.decode(phase_modes, phase_lengths)
        elif phase == "prefill":
            sweep.prefill(phase_modes, phase_lengths)
        elif phase == "max-context" and is_cuda:
            sweep.max_context(phase_modes, parse_tokens(args.max_context_limit)[0])
        elif phase == "peak":
            sweep.peak(phase_modes, phase_lengths)
        elif phase == "profile":
            sweep.profile(phase_modes[0], phase_lengths[0], data_file(out, "profile.txt"))


_MODELS: dict = {}


def _built_model(name: str, device: torch.device):
    """One model per (name, device) per process: the one-call GPU run (``gpu_all``) builds the 8B shape once."""
    if (name, str(device)) not in _MODELS:
        _MODELS.clear()  # one model on the card at a time: the 8B and the 27B hybrid together pass a 24 GiB budget
        if device.type == "cuda":
            torch.cuda.empty_cache()
        _MODELS[(name, str(device))] = build_model(name, device)
    return _MODELS[(name, str(device))]


def _host_budget(ceilings: dict | None) -> int:
    """Pinned bytes the KV store may use: what the ceilings probe could pin, else 85% of available RAM."""
    if ceilings and ceilings["metrics"].get("host_pinned_ok_bytes"):
        return int(ceilings["metrics"]["host_pinned_ok_bytes"])

    return int(psutil.virtual_memory().available * 0.85)


def _report(records: list[dict], out: Path, name: str) -> None:
    write_markdown(records, out / f"{name}.md", title="HeadInfer Studio — GPU benchmarks")
    write_plots(records, data_folder(out), name)


def _cpu_smoke(args, out: Path) -> int:
    modes = parse_modes("all" if args.modes == "all" else args.modes, SMOKE_MODES)
    path = run_smoke(out, model_name=args.smoke_model, modes=modes, lengths=parse_tokens(args.lengths or "512,2048"),
                     chunk_size=args.chunk_size or 512, decode_steps=args.decode_steps, repeats=args.repeats,
                     resume=args.resume, name=args.name or "cpu-smoke", threads=args.threads)
    print(path.read_text())  # a benchmark script prints its table
    return 0


def run_step(args, run_args: list[str], store, out: Path, seconds: float) -> None:
    """One ``gpu_all`` step through this runner: ``run_args`` scaled by ``args.scale``, within ``seconds``."""
    scaled = _scale(run_args, args.scale)
    step = parse_args([*scaled, "--out", str(out), "--device", args.device, "--model", args.model,
                           "--budget-gib", str(args.budget_gib), "--budget-s", str(seconds),
                           "--time-limit", str(seconds)])
    _run_gpu(step, store, out, "gpu")


def _scale(run_args: list[str], scale: float) -> list[str]:
    """Scales the token lists (``--*-lengths``, ``--lengths``, ``--profile-context``) for a small smoke run."""
    if scale == 1.0:
        return run_args
    scaled = list(run_args)
    for i, value in enumerate(scaled[:-1]):
        if value in ("--lengths", "--decode-lengths", "--peak-lengths", "--profile-context"):
            tokens = [max(16, int(t * scale)) for t in parse_tokens(scaled[i + 1])]
            scaled[i + 1] = ",".join(str(t) for t in tokens)
    return scaled


if __name__ == "__main__":
    sys.exit(main())
