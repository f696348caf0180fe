"""The one-call GPU run's steps (``STEPS``: order and caps), and the two that run a program of their own.

The self-check and the GPU tests each run in a child process under a hard time limit (a hung CUDA call cannot
take the session with it) and leave one record whatever happens: the child's exit status, its counts, and the
tail of its output; the full output goes to ``<out>/<step>.log``. The parsers are pure, tested on fixed text.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..harness.junit import summarize_junit

_DECODE = ["--phases", "decode", "--decode-steps", "4", "--repeats", "2", "--resume"]
_MAX_CONTEXT_MODES = "headinfer-g1-int8,headinfer-adaptive,standard,chunked,headinfer-g1-int8-disk"
HYBRID = "qwen3.6-27b"  # benchmarks/harness/hybrid.py: Qwen3.6-27B's shape, random, nf4 (the smoke run: tiny-hybrid)


@dataclass(frozen=True)
class Step:
    name: str
    cap_s: float
    run_args: tuple[str, ...] | None = None  # ``benchmarks.harness.run`` arguments, or None for a step run here
    model: str | None = None  # the step's model where it is not ``--model``'s


STEPS = [
    # What no lease has measured yet comes first (issues 49 and 50); the caps add up to 525 s (the test checks).
    # Correctness: every self-check case, MoE nf4 experts included (launch.py --self-check --kv-8bit int8
    # --kv-disk-dir; 51 s warm on the H200, 2026-11-27, before the quantized and MoE cases).
    Step("self-check", 60),
    Step("ceilings", 15),  # link, matmul, attention kernel: every floor below is computed from them
    # The 27B hybrid at 4 bits under 24 GiB (issue 49 item 7): 8 / 32 / 64 GiB of KV at 128K / 512K / 1M, split
    # (host attention for a share of the heads) and streamed. The target: <= 0.8x the PCIe floor at 512K and 1M.
    Step("hybrid-decode", 150, ("--phases", "decode", "--modes", "headinfer-g1-split,headinfer-g1",
                                "--decode-lengths", "128K,512K,1M", "--decode-steps", "3", "--repeats", "1",
                                "--resume"), model=HYBRID),
    # Pinned memory as a budget (issue 50 item 6): a refused pin on each path, then an exact forward; decode at 128K
    # of Llama-3-8B's 16 GiB of KV fully pinned vs through the staging ring at a 4 GiB pin limit.
    Step("pin-budget", 60),
    # The plan against the card for the hybrid: allocated, reserved and NVML peaks next to the planned bytes.
    Step("hybrid-peak", 30, ("--phases", "peak", "--peak-modes", "headinfer-adaptive", "--peak-lengths", "128K",
                             "--resume"), model=HYBRID),
    # Prefill to 128K against its FLOP floor; 32K first, so the sweep's projection can refuse a 128K past the cap
    # (48 of the 64 layers run transformers' torch Gated DeltaNet: no flash-linear-attention on the lent image).
    Step("hybrid-prefill", 60, ("--phases", "prefill", "--modes", "headinfer-adaptive", "--lengths", "32K,128K",
                                "--repeats", "1", "--resume"), model=HYBRID),
    # nf4 fused MoE experts: the GPU's peak while loading, dense experts against nf4 ones (quantized_experts.py).
    Step("moe-load-peak", 35),
    # The default model through the app's own API on CUDA, a real PDF: where the image has the app's packages and
    # the default's weights; else one record naming what was missing (neither travels in a 64 MiB call).
    Step("app-e2e", 15),
    # pytest -m gpu over every file with the mark, 4 workers (100 s cut it in its last test on the H200, 2026-11-27)
    Step("gpu-tests", 100),
]

#: Measured on the H200 runs of 2026-11-26/27 (docs/benchmarks/gpu-h200.md): by name only (``--steps decode,...``),
#: with the caps they had then.
EARLIER_STEPS = [
    Step("filled-cache", 10),  # one decode step over a 32K random cache vs a reference attention
    # read GB/s, kernel GB/s, g1 decode split / on the host / streamed at 32K-512K
    Step("host-attention", 95),
    Step("decode", 50, (*_DECODE, "--modes", "standard,headinfer-g1,headinfer-adaptive,headinfer-g1-split",
                        "--decode-lengths", "1K,32K,128K,512K")),  # what host-attention measured is not redone
    # bf16 KV of Llama-3-8B at 1M tokens is 128 GiB: past a 126 GiB machine; 8-bit codes and scales take 68.
    Step("decode-1M-int8", 35, ("--phases", "decode", "--modes", "headinfer-g1-int8", "--decode-lengths", "1M",
                                "--decode-steps", "3", "--repeats", "1", "--resume")),
    # Largest context per mode: head-wise ones up to the RAM limit (8-bit KV) and past it (the disk tier).
    Step("max-context", 50, ("--phases", "max-context", "--modes", _MAX_CONTEXT_MODES, "--resume")),
    Step("peak", 25, ("--phases", "peak", "--peak-modes", "headinfer-adaptive,headinfer-g1",
                      "--peak-lengths", "32K,128K", "--resume")),
    # 40K between: a sweep projects each length from the last, quadratically (10K's 0.9 s would forbid 100K).
    Step("prefill", 30, ("--phases", "prefill", "--modes", "standard,headinfer-adaptive", "--lengths",
                         "10K,40K,100K", "--repeats", "1", "--resume")),
]

#: ``launch.py --self-check`` prints one line per case: feature, architecture, dtype, then ``ok`` or why not
_CASE = re.compile(r"headinfer\.launch: (?P<feature>[a-z0-9_]+)\s+(?P<arch>\S+)\s+(?P<dtype>float32|bfloat16|float16)"
                   r"\s+(?P<outcome>.+)$")
_RATE = re.compile(r"headinfer\.launch: (?P<name>[a-z0-9_]+_gbps): (?P<value>[0-9.]+) GB/s")
_STATUS = re.compile(r"headinfer\.launch: (?P<line>.+?) \(report: (?P<path>[^)]+)\)\s*$")
#: a verbose pytest line, plain (``file::test PASSED [ 3%]``) or from an xdist worker (``[gw1] [ 3%] PASSED file::test``)
_OUTCOME = re.compile(r"\b(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")


def parse_self_check(output: str) -> dict:
    """Cases, rates and the status line from ``launch.py --self-check`` output."""
    cases, rates, status = [], {}, None
    for line in output.splitlines():
        if match := _STATUS.search(line):
            status = match["line"]
        elif match := _RATE.search(line):
            rates[match["name"]] = float(match["value"])
        elif match := _CASE.search(line):
            outcome = match["outcome"].strip()
            cases.append({"feature": match["feature"], "arch": match["arch"], "dtype": match["dtype"],
                          "outcome": outcome})
    passed = sum(case["outcome"] == "ok" for case in cases)
    return {"cases": cases, "num_cases": len(cases), "num_ok": passed, "features": sorted({c["feature"] for c in cases}),
            "not_ok": [f"{c['feature']}/{c['arch']}/{c['dtype']}: {c['outcome']}" for c in cases if c["outcome"] != "ok"],
            "status_line": status, **rates}


def parse_pytest_log(output: str) -> dict:
    """Counts of a verbose pytest run's outcomes, also of one cut short (no JUnit file then)."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failures = []
    for line in output.splitlines():
        match = _OUTCOME.search(line)
        if match is None or "::" not in line or line.startswith(("FAILED ", "ERROR ", "SKIPPED ")):
            continue  # the short summary at the end repeats the failures
        word = match.group(1)
        key = {"PASSED": "passed", "XPASS": "passed", "FAILED": "failed", "ERROR": "failed"}.get(word, "skipped")
        counts[key] += 1
        if key == "failed":
            failures.append(next(token for token in line.split() if "::" in token))
    return {**counts, "tests": sum(counts.values()), "failures": failures}


def parse_failure_log(text: str) -> dict[str, str]:
    """``{test id: its first 'E ' line}`` from the failure log ``tests/conftest.py`` appends to (the error itself;
    a report without one keeps its last line)."""
    reasons = {}
    for block in text.split("\n=== ")[1:]:
        header, _, body = block.partition("\n")
        lines = [line for line in body.splitlines() if line.strip()]
        errors = [line[1:].strip() for line in lines if line.startswith("E ")]
        reasons[header.rsplit(" (", 1)[0]] = (errors[0] if errors else lines[-1].strip() if lines else "")[:300]
    return reasons


def self_check(store, out: Path, seconds: float, device: str) -> None:
    """``launch.py --self-check`` with every feature: 8-bit host KV (int8) and a disk tier, over nf4 weights (the
    MoE case's experts too: the dense self-check was green on the H200 of 2026-11-27, nf4 never ran on a GPU)."""
    with tempfile.TemporaryDirectory(prefix="headinfer-selfcheck-") as disk:
        command = [sys.executable, "launch.py", "--self-check", "--device", device, "--kv-8bit", "int8",
                   "--kv-disk-dir", disk, "--weights", "bnb-nf4"]
        # Its own cache folder: the report and the built host kernel of this check replace no user's.
        code, output, timed_out = _run(command, seconds, out / "self-check.log", {"HEADINFER_CACHE": f"{disk}/cache"})
    parsed = parse_self_check(output)
    is_ok = code == 0 and parsed["num_cases"] > 0 and not parsed["not_ok"]
    store.append("self-check", "int8+disk+nf4", status="ok" if is_ok else "timeout" if timed_out else "failed",
                 exit_code=code, timed_out=timed_out, **parsed, output_tail=output[-1500:])


def gpu_tests(store, out: Path, seconds: float, workers: int) -> None:
    """``pytest -m gpu`` over every test file with a ``gpu`` mark, in ``workers`` processes (0: this one)."""
    files = sorted(str(path) for path in Path("tests").rglob("test_*.py") if "mark.gpu" in path.read_text())
    junit = out / "gpu-tests-junit.xml"
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-rfE", "-p", "no:cacheprovider",
               f"--junitxml={junit}", *files]
    if workers and importlib.util.find_spec("xdist") is not None:
        command += ["-n", str(workers)]
    if importlib.util.find_spec("pytest_timeout") is not None:
        command += ["--timeout", "120"]  # one hung test fails alone, the rest still report
    failures_log = out / "gpu-failures.log"  # each failure's report as it happens (tests/conftest.py): kept when cut
    failures_log.unlink(missing_ok=True)
    code, output, timed_out = _run(command, seconds, out / "gpu-tests.log", {"HEADINFER_FAILURE_LOG": str(failures_log)})
    reasons = parse_failure_log(failures_log.read_text(errors="replace")) if failures_log.is_file() else {}
    counts = summarize_junit(junit) if junit.is_file() and not timed_out else parse_pytest_log(output)
    junit.unlink(missing_ok=True)  # its counts are in the record; the folder that comes back holds 8 files
    # Exit status 5: nothing selected (no test has the mark here); 0: all passed (skips included).
    status = "timeout" if timed_out else "ok" if code in (0, 5) and not counts["failed"] else "failed"
    store.append("gpu-tests", "pytest -m gpu", status=status, exit_code=code, timed_out=timed_out,
                 files=len(files), workers=workers, **counts, failure_reasons=reasons, output_tail=output[-1500:])


def pin_budget(store, seconds: float, device: str, scale: float = 1.0) -> None:
    """``benchmarks.gpu.pin_budget`` in a child (its decode runs spawn their own: pins count per process); its
    files stay in a temporary folder (the call brings back at most 8), its results go into the records."""
    with tempfile.TemporaryDirectory(prefix="headinfer-pin-budget-") as folder:
        command = [sys.executable, "-m", "benchmarks.gpu.pin_budget", "--device", device, "--out", folder]
        if scale != 1.0:  # the smoke run: a short context, few layers, two steps
            command += ["--context", str(max(256, int((128 << 10) * scale))), "--layers", "4", "--steps", "2"]
        elif device.startswith("cuda"):  # the case: Llama-3-8B's 16 GiB of KV at 128K, a 4 GiB pin limit
            command += ["--layers", "32", "--limit", "4GiB", "--steps", "3"]
        code, output, timed_out = _run(command, seconds, Path(folder) / "pin-budget.log")
        results_file = Path(folder) / "pin-budget.json"
        results = json.loads(results_file.read_text()) if results_file.is_file() else {}
    failed = results.get("failed_pin", [])
    for row in failed:
        store.append("pin-budget", f"failed pin: {row['path']}", status="ok" if row["forward_ok"] else "failed",
                     refused=str(row["refused"]), forward=row["forward"])
    for label in ("pinned", "staged"):
        run = dict(results.get(label) or {})
        if run:
            store.append("pin-budget", f"decode {label}", context=run.pop("context", None),
                         status="error" if "error" in run else "ok", **run)
    if not results:
        store.append("pin-budget", None, status="timeout" if timed_out else "error", exit_code=code,
                     output_tail=output[-1500:])
    elif "ratio" in results:
        store.append("pin-budget", "staged / pinned", status="ok", ratio=results["ratio"])


def _run(command: list[str], seconds: float, log: Path, env: dict | None = None) -> tuple[int | None, str, bool]:
    """(exit status or None, output, timed out?) of ``command``, its output also written to ``log``.

    The child leads a process group of its own, so a timeout ends its workers too (pytest-xdist's would
    otherwise keep their GPU memory while the benchmarks run)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "w") as sink:
        child = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code, timed_out = child.wait(timeout=max(1.0, seconds)), False
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            code, timed_out = None, True
    return code, log.read_text(errors="replace"), timed_out
