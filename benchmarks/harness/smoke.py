"""The CPU variant: the same probes, records, tables and plots as the GPU run, at short lengths.

Modes: ``stock`` (SDPA + ``DynamicCache``, chunked prefill), ``headinfer`` (every home resident: zero-copy views),
``headinfer-pingpong`` (``resident_slots=0``: every head group copied through the ping-pong buffers).
Prefill is a real chunked prefill of random tokens; decode runs on a cache filled with random K/V, as on the GPU.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path

import torch

from .models import build_model
from .modes import Mode, Runner
from .probes import time_decode, time_prefill, warm_up
from ..records import ResultStore, run_stamp
from .layout import data_file, data_folder
from .report import write_markdown, write_plots
from .timing import release_memory

logger = logging.getLogger(__name__)


def run_smoke(out_dir: Path, *, model_name: str = "smollm2", modes: list[Mode], lengths: list[int],
              chunk_size: int = 512, decode_steps: int = 8, repeats: int = 3, resume: bool = False,
              max_seconds: float = 5.0, name: str = "cpu-smoke", threads: int | None = None) -> Path:
    """Measures prefill and decode tokens/s per mode and length; writes ``{name}.json`` / ``.md`` / plots.

    Modes take turns within each round (A B C, A B C, ...) so that load from other processes on a shared
    machine lands on all of them alike; rounds stop after ``repeats`` or once a length has used
    ``max_seconds`` per mode (at least one round). The figure is the median over the pooled samples.
    """

    started = time.monotonic()
    if threads:
        torch.set_num_threads(threads)
    model = build_model(model_name, "cpu")
    runner = Runner(model, torch.device("cpu"), chunk_size=chunk_size)
    stamp = run_stamp("cpu") | {"model": runner.describe(model_name), "threads": torch.get_num_threads()}
    store = ResultStore(data_file(out_dir, f"{name}.json"), stamp)
    for mode in modes:
        warm_up(runner, mode, length=min(64, chunk_size))
    measures = {
        "prefill": lambda mode, n: time_prefill(runner, mode, n, repeats=1),
        "decode": lambda mode, n: time_decode(runner, mode, n, steps=decode_steps),
    }
    for length in lengths:
        for phase, measure in measures.items():
            todo = [m for m in modes if not (resume and store.is_done(phase, m.name, length))]
            samples, last = {m.name: [] for m in todo}, {}
            phase_started = time.monotonic()
            for _ in range(max(1, repeats)):
                for mode in todo:
                    last[mode.name] = measure(mode, length)
                    samples[mode.name] += last[mode.name]["samples"]
                    release_memory("cpu")
                if time.monotonic() - phase_started >= max_seconds * len(todo):
                    break
            for mode in todo:
                store.append(phase, mode.name, context=length, **_pooled(phase, length, last[mode.name],
                                                                          samples[mode.name]))
    write_report(store.records, out_dir, name)
    logger.info("CPU smoke done in %.0f s", time.monotonic() - started)
    return out_dir / f"{name}.md"


def _pooled(phase: str, length: int, metrics: dict, samples: list[float]) -> dict:
    seconds = statistics.median(samples)
    if phase == "prefill":
        return {**metrics, "samples": samples, "seconds": seconds, "tokens_per_s": length / seconds}
    return {**metrics, "samples": samples, "seconds_per_token": seconds, "tokens_per_s": 1.0 / seconds}


def write_report(records: list[dict], out_dir: Path, name: str) -> None:
    write_markdown(records, out_dir / f"{name}.md", title="HeadInfer Studio — CPU smoke benchmark", reference="stock")
    write_plots(records, data_folder(out_dir), name, reference="stock")
