"""``python -m benchmarks.gpu_all``: every GPU measurement in one process, most valuable first, one deadline.

Made for one device call of at most 10 minutes on a fresh machine that has only torch and transformers::
    TORCH_CUDNN_SDPA_DEPRIORITIZED=1 PYTHONUNBUFFERED=1 python -m benchmarks.gpu_all --out "$OUT" --deadline-s 540

Each result is appended to ``<out>/gpu.json`` the moment it exists (a killed call keeps everything before it),
and ``gpu.md`` plus plots are rewritten at the end. Steps, in order (each capped, all under the deadline):
1. GPU parity tests (``pytest -m gpu``, in this process): every tiny family in fp32 and bf16, the KV-core checks
2. a 32K-token filled-cache decode step against a reference attention; a short run under ``TORCH_CUDA_SANITIZER=1``
3. ceilings: pinned H2D, D2H, both at once; bf16 matmul; the attention kernel; host pinning (at most 64 GiB)
4. decode s/token: standard, layer-wise, head-wise g1, adaptive at 1K-512K (ratios to standard and the PCIe floor)
5. host attention (issue 12): the host's read bandwidth and host-kernel GB/s, then g1 decode at 32K/128K/512K
   with every group streamed, the planner's split, and every group on the host (ratios to the PCIe floor)
6. a profiler summary of g1 decode at 8K and 128K (how busy the H2D engine is)
7. prefill at 10K, 40K, 100K (ratios to standard and the FLOP floor)
8. GPU peak vs context against the planner; the largest context per mode under the 24 GiB budget

``--device cpu --model tiny`` runs the same plumbing on a tiny model (the CI smoke test).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")  # an H100 then picks SDPA backends as a 4090 does

import torch  # noqa: E402

from engine.kv import kernels

from .gpu_checks import filled_cache_check
from .host_attention import gpu_step
from .junit import summarize_junit
from .records import ResultStore, run_stamp
from .run import _report, run_step

logger = logging.getLogger(__name__)

# (step, seconds cap, run.py arguments or None for a step implemented here)
STEPS = [
    ("parity", 170, None),
    ("filled-cache", 40, None),
    ("sanitizer", 60, None),
    ("ceilings", 60, ["--phases", "ceilings"]),
    ("decode", 200, ["--phases", "decode", "--modes", "standard,layerwise,headinfer-g1,headinfer-adaptive",
                     "--decode-lengths", "1K,8K,32K,128K,512K", "--decode-steps", "4", "--repeats", "2"]),
    ("host-attention", 150, None),
    ("profile-8K", 30, ["--phases", "profile", "--profile-mode", "headinfer-g1", "--profile-context", "8K"]),
    ("profile-128K", 40, ["--phases", "profile", "--profile-mode", "headinfer-g1", "--profile-context", "128K"]),
    ("prefill", 150, ["--phases", "prefill", "--modes", "standard,headinfer-adaptive,headinfer-g1",
                      "--lengths", "10K,40K,100K", "--repeats", "1"]),
    ("peak", 120, ["--phases", "peak", "--peak-lengths", "32K,128K,512K"]),
    ("max-context", 150, ["--phases", "max-context", "--modes", "standard,chunked,layerwise,headinfer-adaptive"]),
]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_all", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="docs/benchmarks", help="folder of gpu.json, gpu.md and plots")
    p.add_argument("--deadline-s", type=float, default=540.0, help="seconds for everything, from start")
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", default="llama3-8b", choices=("llama3-8b", "tiny"))
    p.add_argument("--budget-gib", type=float, default=24.0, help="emulated GPU memory")
    p.add_argument("--steps", default="all", help="comma list of step names (default all)")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every token count (CPU smoke: small)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    started = time.monotonic()
    deadline = started + args.deadline_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    store = ResultStore(out / "gpu.json", run_stamp(args.device))
    store.stamp["env"] = {k: os.environ.get(k) for k in ("TORCH_CUDNN_SDPA_DEPRIORITIZED",)}
    wanted = None if args.steps == "all" else set(args.steps.split(","))
    for name, cap, run_args in STEPS:
        if wanted is not None and name not in wanted:
            continue
        left = deadline - time.monotonic()
        if left < 20:
            logger.info("deadline: skipping %s and everything after it", name)
            store.append("gpu_all", name, status="skipped-deadline")
            break
        seconds = min(cap, left - 10)
        logger.info("step %s (%.0f s of %.0f s left)", name, seconds, left)
        step_started = time.monotonic()
        try:
            if run_args is None:
                _local_step(name, args, store, out, seconds)
            else:
                run_step(args, run_args, store, out, seconds)
        except Exception as exc:  # an unattended run records the failure and goes on
            logger.exception("step %s failed", name)
            store.append("gpu_all", name, status="error", reason=str(exc)[:300])
        _record_routes(store, name, time.monotonic() - step_started)
    _report(store.records, out, "gpu")
    logger.info("done in %.0f s", time.monotonic() - started)
    return 0


def _local_step(name: str, args, store, out: Path, seconds: float) -> None:
    is_cuda = args.device == "cuda"
    if name == "parity":
        import pytest  # start-up time: only the parity step runs the test suite

        junit = out / "parity-junit.xml"
        code = pytest.main(["-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                            "tests/engine/test_gpu_parity.py", "tests/engine/test_gpu_kv_core.py",
                            "tests/engine/test_gpu_host_attention.py"])
        store.append("parity", "pytest -m gpu", status="ok" if int(code) in (0, 5) else "failed",
                     exit_code=int(code), **summarize_junit(junit))
    elif name == "filled-cache":
        context = max(256, int(32768 * args.scale))
        for dtype in (torch.bfloat16, torch.float32):
            result = filled_cache_check(args.device, context=context, dtype=dtype)
            store.append("filled-cache", f"headinfer-g1-{result.pop('dtype')}", context=result.pop("context"),
                         status="ok" if result["ok"] else "failed", **result)
    elif name == "host-attention":
        gpu_step(args, store, out, seconds)
    elif name == "sanitizer":
        if not is_cuda:
            store.append("sanitizer", None, status="skipped-no-cuda")
            return
        env = {**os.environ, "TORCH_CUDA_SANITIZER": "1"}
        done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_checks", "--sanitizer"], env=env,
                              capture_output=True, text=True, timeout=seconds)
        clean = done.returncode == 0 and "SANITIZER-CLEAN" in done.stdout and "CSAN" not in done.stderr
        store.append("sanitizer", None, status="ok" if clean else "failed", exit_code=done.returncode,
                     output_tail=(done.stdout + done.stderr)[-2000:])


def _record_routes(store, step: str, seconds: float) -> None:
    """Which attention routes ran in the step (``engine.kv.kernels``), e.g. to see SDPA never fell to math."""
    store.append("gpu_all", step, status="done", seconds=seconds, routes=dict(kernels.ROUTE_COUNTS))
    kernels.ROUTE_COUNTS.clear()


if __name__ == "__main__":
    sys.exit(main())
