"""The results file: an append-only JSON list of records, each stamped with the run that produced it.

A record is ``{"phase", "mode", "context", "budget_gib", "status", "metrics", "run"}``; ``run`` is the stamp
(GPU, driver, torch, transformers, date, machine). ``--resume`` skips a measurement when a record with the same
key and a final status already exists for the same device; everything else is appended, never rewritten.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import platform
import secrets
from pathlib import Path

import psutil
import torch
import transformers

logger = logging.getLogger(__name__)

#: statuses that are results (a retry would give the same answer); anything else is retried on resume
FINAL_STATUSES = frozenset({"ok", "oom", "host_oom", "refused"})


#: what a report says of a VM whose memory bandwidth moves with other tenants
IN_TURNS = " (a VM whose memory bandwidth moves with other tenants: only figures taken in turns compare)"


def machine_line(stamp: dict, note: str = "") -> str:
    """A report's line on who measured: the machine, torch and the load average when the run began, then ``note``."""
    return (f"Machine: {stamp.get('machine', '?')}; torch {stamp.get('torch', '?')}; load average at the start "
            f"{stamp.get('load_avg', '?')}{note}.")


def run_stamp(device: str = "cpu") -> dict:
    """Who measured: versions, GPU and driver, machine, date; one per process."""
    stamp = {
        "run_id": datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(2),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs "
                   f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM",
        "device": device,
        "gpu": None,
        "driver": None,
        "cuda": torch.version.cuda,
        "load_avg": [round(x, 2) for x in os.getloadavg()],  # other work on the machine makes timings noisy
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        stamp["gpu"] = torch.cuda.get_device_name()
        stamp["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        stamp["driver"] = _driver_version()
    return stamp


def _driver_version() -> str | None:
    try:
        import pynvml  # optional dependency: NVML (nvidia-ml-py) where a driver is

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception as exc:  # no NVML is a missing figure, not a failed run
        logger.debug("no driver version from NVML: %s", exc)
        return None


def record_key(record: dict) -> tuple:
    """What makes two records measure the same thing."""
    run = record.get("run") or {}
    model = (run.get("model") or {}).get("name")  # one run measures the 8B and the 27B hybrid in the same modes
    return (record.get("phase"), record.get("mode"), record.get("context"), record.get("budget_gib"),
            run.get("gpu") or run.get("device"), record.get("variant"), model)


class ResultStore:
    """One results file. Every ``append`` rewrites it atomically, so a killed run keeps what it measured."""

    def __init__(self, path: str | os.PathLike, stamp: dict | None = None):
        self.path = Path(path)
        self.stamp = stamp
        self.records: list[dict] = load_records(self.path)

    def append(self, phase: str, mode: str | None, *, status: str = "ok", context: int | None = None,
               budget_gib: float | None = None, variant: str | None = None, **metrics) -> dict:
        record = {"phase": phase, "mode": mode, "context": context, "budget_gib": budget_gib, "variant": variant,
                  "status": status, "metrics": metrics, "run": dict(self.stamp or {})}  # the stamp as now
        self.records.append(record)
        self._write()
        logger.info("%s %s ctx=%s %s %s", phase, mode, context, status,
                    {k: _short(v) for k, v in metrics.items() if not isinstance(v, (dict, list, str))})
        return record

    def is_done(self, phase: str, mode: str | None, context: int | None = None, budget_gib: float | None = None,
                variant: str | None = None) -> bool:
        """True when a final record for this key exists for this run's device (what ``--resume`` skips)."""
        probe = {"phase": phase, "mode": mode, "context": context, "budget_gib": budget_gib, "variant": variant,
                 "run": self.stamp}
        key = record_key(probe)
        return any(r.get("status") in FINAL_STATUSES and record_key(r) == key for r in self.records)

    def latest(self, phase: str, mode: str | None = None) -> dict | None:
        """The newest final record of a phase (and mode) on this run's device."""
        device = (self.stamp or {}).get("gpu") or (self.stamp or {}).get("device")
        for record in reversed(self.records):
            run = record.get("run") or {}
            if (record.get("phase") == phase and (mode is None or record.get("mode") == mode)
                    and record.get("status") in FINAL_STATUSES and (run.get("gpu") or run.get("device")) == device):
                return record
        return None

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(self.records, indent=1, default=str) + "\n")
        os.replace(partial, self.path)


def load_records(path: str | os.PathLike) -> list[dict]:
    """The records of a results file; a missing file is an empty list."""
    path = Path(path)
    if not path.is_file():
        return []
    records = json.loads(path.read_text() or "[]")
    if not isinstance(records, list):
        raise ValueError(f"{path} is not a list of benchmark records")
    return records


def append_jsonl(path: str | os.PathLike, *records: dict) -> None:
    """Appends ``records`` to a JSON-lines file, one line each (the evals' files: a run cut short keeps every
    answer already recorded, and a rerun skips them)."""
    with Path(path).open("a") as file:
        file.writelines(json.dumps(record) + "\n" for record in records)


def latest_by_key(records: list[dict]) -> list[dict]:
    """The newest record of every key, in first-seen order (reports show one figure per measurement)."""
    newest: dict[tuple, dict] = {}
    for record in records:
        newest[record_key(record)] = record
    return list(newest.values())


def _short(value):
    return round(value, 4) if isinstance(value, float) else value
