"""``python -m benchmarks.gpu.gpu_all``: every GPU measurement in one process, most valuable first, one deadline.

Made for one device call of at most 10 minutes on a bare machine (torch and transformers; ``gpu_session.sh``
installs the rest from carried wheels)::
    python -m benchmarks.gpu.gpu_all --out "$OUT" --deadline-s 520

Each result is appended to ``<out>/gpu.json`` the moment it exists (a killed call keeps everything before it);
``gpu.md`` and ``summary.md`` (one row per step) are written at the end, and the summary is printed. Each step
has its own cap (seconds, on an H100/H200; ``STEPS`` in ``gpu_steps.py``: what no lease has measured, first) and all
of them share the deadline. The caps add up to 525 s; the steps earlier leases measured (``EARLIER_STEPS``) run by
name (``--steps decode,peak``). A step that runs a program (the self-check, the GPU tests) is stopped at its cap; a sweep stops starting
measurements its cap would not cover (a measurement under way finishes).

``--device cpu --model tiny --scale 0.002`` runs every step's plumbing on a CPU in a few minutes (the smoke run;
``tests/benchmarks/test_gpu_session.py`` runs a subset of it in CI). A second run into the same folder resumes:
what is recorded there for this device is not measured again.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")  # an H100 then picks SDPA backends as a 4090 does

import torch  # noqa: E402

from engine.kv import kernels

from . import gpu_steps, lease_steps
from ..harness.ceilings import measure_all
from .gpu_checks import filled_cache_check
from .gpu_steps import EARLIER_STEPS, STEPS, Step
from .gpu_summary import summary_table
from ..cpu.host_attention import gpu_step as host_attention_step
from ..harness.modes import GPU_MODES, Runner, parse_modes
from ..records import ResultStore, run_stamp
from ..harness.report import write_markdown
from ..harness.run import _built_model, parse_tokens, run_step
from ..harness.sweeps import Sweep

logger = logging.getLogger(__name__)
ALL_STEPS = [*STEPS, *EARLIER_STEPS]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu.gpu_all", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=f"docs/benchmarks/runs/{time.strftime('%Y-%m-%d')}",
                   help="the run's folder: gpu.json, gpu.md, summary.md and logs")
    p.add_argument("--deadline-s", type=float, default=520.0, help="seconds for everything, from start")
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", default="llama3-8b", choices=("llama3-8b", "tiny"),
                   help="the benchmarks' model (tiny: the hybrid steps take tiny-hybrid too)")
    p.add_argument("--budget-gib", type=float, default=24.0, help="emulated GPU memory")
    p.add_argument("--steps", default="all", help=f"comma list of {', '.join(s.name for s in ALL_STEPS)} (default "
                                                  "all: the lease's, STEPS; the earlier ones by name)")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every token count (CPU smoke: 0.002)")
    p.add_argument("--test-workers", type=int, default=4, help="pytest-xdist workers of the GPU tests (0: one)")
    p.add_argument("--cap-scale", type=float, default=1.0,
                   help="multiplies every step's cap (the CPU smoke run: a slow shared CPU is not an H100)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    started = time.monotonic()
    deadline = started + args.deadline_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    store = ResultStore(out / "gpu.json", run_stamp(args.device))
    store.stamp["env"] = {k: os.environ.get(k) for k in ("TORCH_CUDNN_SDPA_DEPRIORITIZED", "PYTORCH_CUDA_ALLOC_CONF")}
    wanted = STEPS if args.steps == "all" else [s for s in ALL_STEPS if s.name in args.steps.split(",")]
    unknown = set(args.steps.split(",")) - {s.name for s in ALL_STEPS} if args.steps != "all" else set()
    if unknown:
        raise SystemExit(f"unknown steps {sorted(unknown)}; choose from {', '.join(s.name for s in ALL_STEPS)}")
    for step in wanted:
        left = deadline - time.monotonic()
        if left < 5:
            store.append("gpu_all", step.name, status="skipped-deadline", cap_s=step.cap_s * args.cap_scale,
                         seconds=0.0)
            continue
        seconds = min(step.cap_s * args.cap_scale, left)
        logger.info("step %s (%.0f s of %.0f s left)", step.name, seconds, left)
        step_started = time.monotonic()
        status = "done"
        try:
            _run(step, args, store, out, seconds)
        except Exception as exc:  # an unattended run records the failure and goes on
            logger.exception("step %s failed", step.name)
            store.append(step.name, None, status="error", reason=str(exc)[:300])
            status = "error"
        store.append("gpu_all", step.name, status=status, cap_s=step.cap_s * args.cap_scale,
                     seconds=time.monotonic() - step_started,
                     routes=dict(kernels.ROUTE_COUNTS))  # which attention routes the step ran (never math)
        kernels.ROUTE_COUNTS.clear()
    write_markdown(store.records, out / "gpu.md", title="HeadInfer Studio — GPU benchmarks")
    text = summary_table(store.records, [(s.name, s.cap_s * args.cap_scale) for s in wanted])
    (out / "summary.md").write_text(text)
    print(f"\n## Summary ({args.device}, {args.model}, {time.monotonic() - started:.0f} s)\n\n{text}")
    return 0


def _run(step: Step, args, store, out: Path, seconds: float) -> None:
    if step.run_args is not None:
        run_args = _scaled_limit(list(step.run_args), args.scale)
        if step.name == "max-context" and torch.device(args.device).type != "cuda":
            _max_context_here(args, store, run_args, seconds)
        else:
            model = step.model and ("tiny-hybrid" if args.model == "tiny" else step.model)
            run_step(argparse.Namespace(**{**vars(args), "model": model or args.model}), run_args, store, out, seconds)
    elif step.name == "self-check":
        gpu_steps.self_check(store, out, seconds, args.device)
    elif step.name == "gpu-tests":
        gpu_steps.gpu_tests(store, out, seconds, args.test_workers)
    elif step.name == "pin-budget":
        gpu_steps.pin_budget(store, seconds, args.device, args.scale)
    elif step.name == "filled-cache":
        context = max(256, int(32768 * args.scale))
        for dtype in (torch.bfloat16, torch.float32):
            result = filled_cache_check(args.device, context=context, dtype=dtype)
            store.append("filled-cache", f"headinfer-g1-{result.pop('dtype')}", context=result.pop("context"),
                         status="ok" if result["ok"] else "failed", **result)
    elif step.name == "ceilings":
        store.append("ceilings", None, **measure_all(device=args.device, scale=args.scale))
    elif step.name == "host-attention":
        host_attention_step(args, store, out, seconds)
    elif step.name == "moe-load-peak":
        lease_steps.moe_load_peak(store, seconds, args.device)
    elif step.name == "app-e2e":
        lease_steps.app_e2e(store, args.device)


def _scaled_limit(run_args: list[str], scale: float) -> list[str]:
    """A scaled run searches up to 1M x ``scale`` tokens (a GPU run: ``benchmarks.harness.run``'s 4M)."""
    if scale == 1.0 or "--phases" not in run_args or run_args[run_args.index("--phases") + 1] != "max-context":
        return run_args
    return [*run_args, "--max-context-limit", str(max(1024, int((1 << 20) * scale)))]


def _max_context_here(args, store, run_args: list[str], seconds: float) -> None:
    """The max-context search on a CPU (``benchmarks.harness.run`` searches on CUDA only: a CPU has no budget to hit).

    The same sweep and frontier probes, up to the scaled limit: the plumbing, not a figure."""
    device = torch.device(args.device)
    modes = parse_modes(run_args[run_args.index("--modes") + 1], GPU_MODES)
    modes = [m for m in modes if m.kind != "layerwise"]  # transformers' offloading cache needs CUDA streams
    limit = parse_tokens(run_args[run_args.index("--max-context-limit") + 1] if "--max-context-limit" in run_args
                         else "4M")[0]
    runner = Runner(_built_model(args.model, device), device, chunk_size=512)
    sweep = Sweep(runner, store, time_limit=seconds, deadline=time.monotonic() + seconds, resume=True)
    store.stamp["model"] = runner.describe(args.model)
    sweep.max_context(modes, limit)


if __name__ == "__main__":
    sys.exit(main())
