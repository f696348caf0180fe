"""Markdown tables and plots from a results file; every figure next to its ratio to the reference and the floor."""

from __future__ import annotations

import logging
from pathlib import Path

from engine.planning.shape import ModelShape

from .floors import Rates, decode_floor_s, prefill_floor_s, ratio
from ..records import latest_by_key

logger = logging.getLogger(__name__)

_GIB = 1 << 30


def annotate(records: list[dict], reference: str = "standard") -> list[dict]:
    """Newest ``prefill`` / ``decode`` records (status ok) as rows with ``x_reference``, ``floor_s``, ``x_floor``."""
    latest = [r for r in latest_by_key(records) if r.get("status") == "ok"]
    rates = _rates_by_device(latest)
    times = {}
    for r in latest:
        if r["phase"] in ("prefill", "decode"):
            times[(_device(r), r.get("budget_gib"), r["phase"], r["mode"], r["context"])] = _seconds(r)
    rows = []
    for r in latest:
        if r["phase"] not in ("prefill", "decode"):
            continue
        seconds = _seconds(r)
        reference_s = times.get((_device(r), r.get("budget_gib"), r["phase"], reference, r["context"]))
        floor = _floor(r, rates.get(_device(r), Rates()))
        rows.append({**r, "seconds": seconds, "x_reference": ratio(seconds, reference_s) if r["mode"] != reference
                     else None, "floor_s": floor, "x_floor": ratio(seconds, floor)})
    return rows


def _seconds(record: dict) -> float | None:
    m = record["metrics"]
    return m.get("seconds_per_token") if record["phase"] == "decode" else m.get("seconds")


def _floor(record: dict, rates: Rates) -> float | None:
    m = record["metrics"]
    if record["phase"] == "decode":
        return decode_floor_s(m.get("offloaded_kv_bytes") or 0, rates)
    shape = model_shape(record)
    if shape is None:
        return None
    return prefill_floor_s(shape, record["context"], rates, (record["run"].get("model") or {}).get("tied", False))


def model_shape(record: dict) -> ModelShape | None:
    info = dict((record.get("run") or {}).get("model") or {})
    if "num_layers" not in info:
        return None
    for key in ("name", "tied", "dtype"):
        info.pop(key, None)
    info["sliding_windows"] = tuple(info.get("sliding_windows") or ())
    return ModelShape(**info)


def _device(record: dict):
    run = record.get("run") or {}
    return run.get("gpu") or run.get("device")


def _rates_by_device(records: list[dict]) -> dict:
    return {_device(r): Rates.from_metrics(r["metrics"]) for r in records if r["phase"] == "ceilings"}


# -- markdown ------------------------------------------------------------------------------------
def write_markdown(records: list[dict], path: Path, *, title: str, reference: str = "standard") -> str:
    latest = latest_by_key(records)
    parts = [f"# {title}", "", *_stamps(latest), ""]
    parts += _ceilings(latest) + _parity(latest) + _max_context(latest)
    parts += _frontier(latest, "frontier", "GPU peak vs context (GiB)")
    parts += _frontier(latest, "peak-test", "GPU peak vs context, whole GPU (GiB; tests/engine/test_gpu_parity.py)")
    rows = annotate(records, reference)
    for phase, unit in (("prefill", "s"), ("decode", "s/token")):
        parts += _timings([r for r in rows if r["phase"] == phase], phase, unit, reference)
    parts += _failures([r for r in latest if r["phase"] in ("prefill", "decode", "frontier")
                        and r.get("status") != "ok"])
    parts += _profile(latest)
    text = "\n".join(parts) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text


def _stamps(records: list[dict]) -> list[str]:
    seen, lines = set(), ["Runs in this table:", ""]
    for r in records:
        run = r.get("run") or {}
        if run.get("run_id") in seen:
            continue
        seen.add(run.get("run_id"))
        lines.append(f"- {run.get('date')} · {run.get('gpu') or run.get('device')} · driver {run.get('driver')} · "
                     f"CUDA {run.get('cuda')} · torch {run.get('torch')} · transformers {run.get('transformers')} · "
                     f"{run.get('machine')} · load {run.get('load_avg')} · model {(run.get('model') or {}).get('name')}"
                     + (f" · {run['threads']} threads" if run.get("threads") else ""))
    budgets = sorted({r.get("budget_gib") for r in records if r.get("budget_gib")})
    if budgets:
        lines += ["", f"GPU budget (emulated with set_per_process_memory_fraction): {budgets} GiB"]
    return lines


def _table(header: list[str], rows: list[list]) -> list[str]:
    """A markdown table; columns empty in every row (no GPU, no ceilings) are left out."""
    keep = [i for i in range(len(header)) if any(row[i] is not None for row in rows)]
    header, rows = [header[i] for i in keep], [[row[i] for i in keep] for row in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return lines + [""]


def _fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def _gib(n) -> float | None:
    return None if n is None else n / _GIB


def _ceilings(records):
    rows = [[r["metrics"].get(k) for k in ("h2d_gbps", "d2h_gbps", "duplex_gbps", "matmul_tflops",
                                           "attention_tflops_g1", "attention_tflops_g8", "attention_backend")]
            + [_gib(r["metrics"].get("host_pinned_ok_bytes"))] for r in records if r["phase"] == "ceilings"]
    if not rows:
        return []
    return ["## Ceilings", ""] + _table(["H2D GB/s", "D2H GB/s", "both GB/s", "bf16 matmul TFLOP/s",
                                         "attention TFLOP/s g1", "attention TFLOP/s g8", "kernel",
                                         "host KV budget GiB"], rows)


def _parity(records):
    rows = [[r["mode"], r["metrics"].get("passed"), r["metrics"].get("failed"), r["metrics"].get("skipped"),
             ", ".join(r["metrics"].get("failures", [])[:8]) or "–"] for r in records if r["phase"] == "parity"]
    return ["## GPU parity tests", ""] + _table(["suite", "passed", "failed", "skipped", "failures"], rows) if rows else []


def _max_context(records):
    rows = [[r["mode"], r["metrics"].get("measured"), r["metrics"].get("predicted"), r["metrics"].get("smallest_failed"),
             len(r["metrics"].get("tried", [])), "host-bound" if r["metrics"].get("is_host_bound") else
             "cut by time" if r["metrics"].get("is_cut_by_time") else ""]
            for r in records if r["phase"] == "max-context"]
    if not rows:
        return []
    return ["## Largest context under the budget", ""] + _table(
        ["mode", "measured (tokens)", "predicted", "smallest failing", "probes", "note"], rows)


def _frontier(records, phase, title):
    rows = []
    for r in sorted((r for r in records if r["phase"] == phase and r["status"] == "ok"),
                    key=lambda r: (r["mode"], r["context"])):
        m = r["metrics"]
        peak = max(m.get("prefill_peak_allocated") or 0, m.get("decode_peak_allocated") or 0) or None
        planned = m.get("planned_gpu_bytes")
        error = None if not (peak and planned) else (peak - planned) / planned * 100
        rows.append([r["mode"], r["context"], m.get("probe"), _gib(m.get("prefill_peak_allocated")),
                     _gib(m.get("decode_peak_allocated")), _gib(m.get("prefill_peak_reserved")),
                     _gib(m.get("decode_peak_nvml_used")), _gib(planned), error, _on_card(m)])
    if not rows:
        return []
    return [f"## {title}", ""] + _table(
        ["mode", "context", "probe", "prefill peak", "decode peak", "reserved", "NVML (end of decode)", "planner",
         "peak vs plan %", "within the plan on the card"],
        rows)


def _on_card(metrics: dict) -> str | None:
    """``yes``, or by how much reserved / NVML (less the context) bytes passed the plan (``probes.against_plan``)."""
    if "holds_on_card" not in metrics:
        return None
    if metrics["holds_on_card"]:
        return "yes"
    over = [f"{name} {metrics[key] / 2**30:+.2f} GiB" for name, key in
            (("allocated", "over_plan_allocated"), ("reserved", "over_plan_reserved"), ("NVML", "over_plan_nvml"))
            if (metrics.get(key) or 0) > 0]
    grown = (metrics.get("scratch_allocated") or 0) - (metrics.get("scratch_planned") or 0)
    if grown > 0:  # the attention scratch is allocated once at its planned size: past it, a call outgrew the plan
        over.append(f"scratch grew {grown / 2**30:+.2f} GiB")
    return "no: " + ", ".join(over)


def _timings(rows, phase, unit, reference):
    if not rows:
        return []
    body = []
    for r in sorted(rows, key=lambda r: (r["mode"], r["context"])):
        m = r["metrics"]
        peak = m.get(f"{phase}_peak_allocated")
        body.append([r["mode"], r["context"], r["seconds"], m.get("tokens_per_s"), r["x_reference"], r["floor_s"],
                     r["x_floor"], _gib(peak), _gib(m.get("offloaded_kv_bytes") or None) if phase == "decode" else None])
    return [f"## {phase.capitalize()}", ""] + _table(
        ["mode", "context", unit, "tok/s", f"× {reference}", "floor", "× floor", "GPU peak GiB",
         "offloaded KV GiB"], body)


def _failures(records):
    rows = [[r["phase"], r["mode"], r["context"], r["status"], r["metrics"].get("inferred_from") or
             (r["metrics"].get("reason") or "")[:80]] for r in records]
    return ["## Not measured (out of memory, refused, skipped)", ""] + _table(
        ["phase", "mode", "context", "status", "why"], rows) if rows else []


def _profile(records):
    rows = []
    for r in (r for r in records if r["phase"] == "profile" and r["status"] == "ok"):
        for step in ("decode_step", "prefill_chunk"):
            s = r["metrics"].get(step) or {}
            overlap = s.get("overlap")
            rows.append([r["mode"], r["context"], step, (s.get("h2d_us") or 0) / 1e3,
                         None if overlap is None else overlap * 100, (s.get("kernel_us") or 0) / 1e3])
    return ["## Copy/compute overlap (torch.profiler)", ""] + _table(
        ["mode", "cached tokens", "step", "H2D ms", "H2D overlapped by kernels %", "kernel ms"], rows) if rows else []


# -- plots ---------------------------------------------------------------------------------------
def write_plots(records: list[dict], out_dir: Path, prefix: str, reference: str = "standard") -> list[Path]:
    try:
        import matplotlib  # optional dependency: plots only where matplotlib is installed

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: no plots (run --report-only where it is)")
        return []
    written = []
    rows = annotate(records, reference)
    for phase, label in (("prefill", "prefill seconds"), ("decode", "seconds per token")):
        chosen = [r for r in rows if r["phase"] == phase]
        if chosen:
            written.append(_plot(plt, chosen, lambda r: r["seconds"], label, out_dir / f"{prefix}-{phase}.png"))
    frontier = [r for r in latest_by_key(records) if r["phase"] == "frontier" and r["status"] == "ok"]
    if frontier:
        peak = lambda r: max(r["metrics"].get("prefill_peak_allocated") or 0,  # noqa: E731
                             r["metrics"].get("decode_peak_allocated") or 0) / _GIB
        written.append(_plot(plt, frontier, peak, "GPU peak GiB (max_memory_allocated)", out_dir / f"{prefix}-peak.png",
                             planned=lambda r: (r["metrics"].get("planned_gpu_bytes") or 0) / _GIB or None))
    return written


def _plot(plt, rows, value, label, path, planned=None):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode in sorted({r["mode"] for r in rows}):
        points = sorted((r["context"], value(r), planned(r) if planned else None) for r in rows if r["mode"] == mode)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=mode)
        if planned and any(p[2] for p in points):
            ax.plot([p[0] for p in points if p[2]], [p[2] for p in points if p[2]], linestyle="--", alpha=0.6,
                    label=f"{mode} (planner)")
    ax.set_xscale("log", base=2)
    if not planned:
        ax.set_yscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel(label)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
