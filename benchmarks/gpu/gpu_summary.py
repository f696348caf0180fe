"""``python -m benchmarks.gpu.gpu_summary --out DIR``: the one-call GPU run's summary table, from ``DIR/gpu.json``.

One row per step of ``benchmarks.gpu.gpu_all``: its time cap, the seconds it took, how its records ended (ok / out of
memory / skipped ...), and its headline figures. ``gpu_all`` prints it at the end; ``gpu_session.sh`` prints it
again from the JSON alone when the run was killed before its end (the steps that finished are all there).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from .gpu_steps import STEPS
from ..records import load_records

_GIB = 1 << 30


def step_records(records: list[dict]) -> list[tuple[dict, list[dict]]]:
    """(the step's closing ``gpu_all`` record, the records the step appended) for each step, in order."""
    steps, start = [], 0
    for index, record in enumerate(records):
        if record["phase"] == "gpu_all":
            steps.append((record, [r for r in records[start:index] if r["phase"] != "gpu_all"]))
            start = index + 1
    return steps


def summary_table(records: list[dict], planned: list[tuple[str, float]] | None = None) -> str:
    """The markdown table; ``planned`` (name, cap) adds a row for each step that left no record."""
    rows, seen = [], set()
    for closing, own in step_records(records):
        name = closing["mode"]
        seen.add(name)
        m = closing["metrics"]
        counts = Counter(r["status"] for r in own)
        status = closing["status"] if closing["status"] != "done" else _step_status(counts)
        rows.append([name, _num(m.get("cap_s")), _num(m.get("seconds")), status,
                     ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "–", headline(name, own) or "–"])
    for name, cap in planned or []:
        if name not in seen:
            rows.append([name, _num(cap), "–", "not run", "–", "–"])
    lines = ["| step | cap s | took s | status | records | result |", "|---|---:|---:|---|---|---|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _step_status(counts: Counter) -> str:
    if not counts:
        return "no result"
    if counts.get("error") or counts.get("failed") or counts.get("timeout"):
        return "failed" if counts.get("failed") else "error" if counts.get("error") else "timeout"
    return "ok" if counts.get("ok") else "not run" if set(counts) == {"not-run"} else "partial"


def headline(step: str, own: list[dict]) -> str:
    """The step's figures in one cell: the longest context measured per mode, the counts of a test run."""
    if any(r["phase"] == "max-context" for r in own):  # its frontier probes are the search's steps, not results
        own = [r for r in own if r["phase"] != "frontier"]
    parts = []
    for record in own:
        text = _figure(record)
        if text:
            parts.append(text)
    return "; ".join(_longest_per_mode(own, parts))


def _longest_per_mode(own: list[dict], parts: list[str]) -> list[str]:
    """For sweeps (one record per mode and context), only each mode's longest ok context and its first failure."""
    keep, best, failed = [], {}, {}
    for record, text in zip([r for r in own if _figure(r)], parts):
        if record["phase"] in ("decode", "prefill", "frontier") and record["context"] is not None:
            key = (record["phase"], record["mode"])
            if record["status"] == "ok":
                if key not in best or record["context"] >= best[key][0]:
                    best[key] = (record["context"], text)
            elif key not in failed:
                failed[key] = (record["context"], text)
            continue
        keep.append(text)
    for key in dict.fromkeys([*best, *failed]):
        keep += [entry[1] for entry in (best.get(key), failed.get(key)) if entry is not None]
    return keep


def _figure(record: dict) -> str:
    phase, mode, m, status = record["phase"], record["mode"], record["metrics"], record["status"]
    context = _tokens(record["context"])
    if phase == "self-check":
        text = f"{m.get('num_ok', 0)}/{m.get('num_cases', 0)} cases ok ({', '.join(m.get('features', []))})"
        return text + (f"; not ok: {', '.join(m['not_ok'][:4])}" if m.get("not_ok") else "")
    if phase in ("gpu-tests", "parity"):
        text = f"{m.get('passed', 0)} passed, {m.get('failed', 0)} failed, {m.get('skipped', 0)} skipped"
        return text + (" (cut at the cap)" if m.get("timed_out") else "")
    if phase == "filled-cache":
        return f"{mode} {context}: max rel error {m.get('max_rel_error', float('nan')):.2g}"
    if phase == "ceilings":
        parts = [f"H2D {m['h2d_gbps']:.1f} GB/s, D2H {m['d2h_gbps']:.1f}" if m.get("h2d_gbps") else "",
                 f"matmul {m['matmul_tflops']:.3g} TFLOP/s" if m.get("matmul_tflops") else "",
                 f"pinned {_size(m.get('host_pinned_probe_bytes', 0))} in {m.get('host_pinned_seconds', 0):.1f} s",
                 f"host KV budget {m.get('host_pinned_ok_bytes', 0) / _GIB:.0f} GiB"]
        return ", ".join(p for p in parts if p)
    if phase == "app-e2e":
        return f"{mode}: {status} ({m.get('reason', '')})"
    if status != "ok":
        return " ".join(filter(None, (mode, context, status))) if phase in ("decode", "prefill", "frontier",
                                                                           "max-context") else ""
    if phase == "pin-budget" and mode == "staged / pinned":
        return f"staging ring {m['ratio']:.2f}x fully pinned per decode token"
    if phase == "pin-budget" and mode.startswith("failed pin"):
        return "" if status == "ok" else f"{mode}: forward {m.get('forward', '')}"
    if phase == "pin-budget":
        return f"{mode} {context} {m['s_per_token']:.3g} s/token" if "s_per_token" in m else ""
    if phase == "moe-load-peak":
        peak = m.get("load_peak_bytes")
        return (f"{mode}: held {_size(m['held_bytes'])}" + (f", load peak {_size(peak)}" if peak else "")
                + f", decode {m['headwise_ms']:.1f} ms head-wise / {m['stock_ms']:.1f} stock")
    if phase == "host-attention" and mode == "read":
        return f"read {m['read_gbps']:.1f} GB/s"
    if phase == "host-attention":
        return f"kernel {context} {m['gbps']:.2f} GB/s ({m.get('x_read', 0):.2f}x read)"
    if phase == "decode":
        offloaded = m.get("offloaded_kv_bytes") or 0
        return f"{mode} {context} {m['seconds_per_token']:.3g} s/token" + (
            f" ({offloaded / _GIB:.1f} GiB offloaded)" if offloaded else "")
    if phase == "prefill":
        return f"{mode} {context} {m['seconds']:.3g} s ({m['tokens_per_s']:,.0f} tok/s)"
    if phase == "frontier":
        planned = m.get("planned_gpu_bytes")
        return (f"{mode} {context} peak {_gib(m.get('prefill_peak_allocated'))}/{_gib(m.get('prefill_peak_reserved'))}"
                f"/{_gib(m.get('prefill_peak_nvml_used'))} GiB alloc/reserved/NVML"
                + (f" vs plan {planned / _GIB:.1f}" if planned else ""))
    if phase == "max-context":
        bound = " (host-bound)" if m.get("is_host_bound") else " (at the limit)" if m.get("is_capped") else ""
        return f"{mode} {_tokens(m.get('measured'))}{bound}"
    return ""


def _tokens(n) -> str:
    if n is None:
        return ""
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    return f"{n / 1024:.0f}K" if n >= 1024 and n % 1024 == 0 else str(n)


def _gib(n) -> str:
    return "–" if n is None else f"{n / _GIB:.1f}"


def _size(n: int) -> str:
    return f"{n / _GIB:.1f} GiB" if n >= _GIB else f"{n >> 20} MiB"


def _num(value) -> str:
    return "–" if value is None else f"{value:.0f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.gpu_summary", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the run's folder, which holds its gpu.json")
    args = parser.parse_args(argv)
    # The steps a killed run never reached still get their row (caps as on a GPU).
    text = summary_table(load_records(Path(args.out) / "gpu.json"), [(step.name, step.cap_s) for step in STEPS])
    (Path(args.out) / "summary.md").write_text(text)
    print(text)  # a benchmark script prints its table
    return 0


if __name__ == "__main__":
    sys.exit(main())
