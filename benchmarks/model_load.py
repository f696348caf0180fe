"""Model load time from a GGUF: parsing it for config, tokenizer and weights (before) vs the converted folder.

Each measurement runs in a fresh Python process (imports and file cache as a user's second start would see
them; the first conversion writes into an empty ``HEADINFER_CACHE``), in rounds so load from other work on the
machine lands on every kind alike. Results: ``docs/benchmarks/model-load.json`` (append-only) and ``.md``.

    .venv/bin/python -m benchmarks.model_load                 # the embedded SmolLM2 GGUF, 2 rounds
    .venv/bin/python -m benchmarks.model_load --gguf path/to/model.gguf --rounds 3
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

from engine.models.loader import _embedded_gguf

from .records import ResultStore, load_records, run_stamp

OUT = Path("docs/benchmarks/model-load.json")

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
    "first-load-converts": "loader.load_model(str(gguf), device='cpu', dtype='float32')",
    "second-load-fp32": "loader.load_model(str(gguf), device='cpu', dtype='float32')",
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
    stamp = records[-1]["run"] if records else {}
    lines = [
        "# Model load time from a GGUF",
        "",
        "`python -m benchmarks.model_load` (raw records: `model-load.json`). Seconds from a fresh Python process to",
        "a loaded model on the CPU, imports included, median of the rounds. Before: the GGUF was",
        "parsed for the config, the tokenizer and the weights on every load (`gguf-direct`). Now the first load",
        "converts it once into a safetensors folder in the cache (`first-load-converts`: the same parses plus a",
        "write) and every later load reads that folder, in fp32 or bf16 (`second-load-*`).",
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
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=None, help="a .gguf file (default: the embedded SmolLM2's)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report-only", action="store_true", help="rewrite the markdown from the JSON")
    args = parser.parse_args(argv)
    if not args.report_only:
        gguf = (args.gguf or _embedded_gguf()).resolve()
        measure(gguf, args.rounds, ResultStore(args.out, run_stamp("cpu")))
    write_markdown(load_records(args.out), args.out)
    print(json.dumps({"markdown": str(args.out.with_suffix(".md"))}))


if __name__ == "__main__":
    main()
