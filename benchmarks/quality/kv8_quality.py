"""What 8-bit host KV costs in quality: SmolLM2 on real text, exact KV vs int8 / fp8, teacher-forced decode.

    python -m benchmarks.quality.kv8_quality [--context 2048] [--steps 256]
    python -m benchmarks.quality.kv8_quality --report-only     # kv8.md again from kv8.json (and niah-int8/fp8.json)

A chunk of a real book (Debian Reference, extracted with the app's own reader) is read into an exact cache and
into 8-bit caches; then the book's next ``steps`` tokens are fed one at a time to each, as decode steps. Per
position: KL(exact || 8-bit) of the next-token distributions and whether the top-1 tokens agree. Writes
docs/benchmarks/kv8.md (data/kv8.json). Targets (issue 11): mean KL <= 0.02 nats, top-1 agreement >= 95%, and the needle
in a haystack grid unchanged: the report adds the 8-bit NIAH runs (``python -m benchmarks.quality.niah --kv-dtype int8``,
niah-int8.json / niah-fp8.json) where they exist.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

import engine
from engine.models.loader import load_model

from ..corpus import fetch_corpus
from .niah import same_cell
from ..records import run_stamp
from ..harness.layout import data_file

logger = logging.getLogger(__name__)


def real_text(folder: Path) -> str:
    from app.documents import (
        read_document,  # start-up time: the document readers (pypdf, pdfium) only where documents are read
    )

    paths = fetch_corpus(folder)
    return read_document(paths["reference-pdf"]).text


@torch.inference_mode()
def measure(model, ids: list[int], context: int, steps: int, kv_dtype: str | None, chunk: int = 512):
    cache = engine.HeadInferCache(model.config, device="cpu", chunk_size=chunk, kv_dtype=kv_dtype,
                                  max_context=context + steps + 1)
    for s in range(0, context, chunk):
        model(torch.tensor([ids[s : min(s + chunk, context)]]), past_key_values=cache, logits_to_keep=1)
    logprobs, started = [], time.perf_counter()
    for t in range(context, context + steps):
        logits = model(torch.tensor([[ids[t]]]), past_key_values=cache).logits[0, -1]
        logprobs.append(torch.log_softmax(logits.double(), dim=-1))
    seconds = time.perf_counter() - started
    return torch.stack(logprobs), cache.kv_bytes()["host"] + cache.kv_bytes()["device"], seconds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality.kv8_quality")
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--steps", type=int, default=256)
    p.add_argument("--corpus", default=".pytest_cache/d/debian-documents")
    p.add_argument("--out", default="docs/benchmarks")
    p.add_argument("--report-only", action="store_true", help="write kv8.md from kv8.json, measure nothing")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = Path(args.out)
    if args.report_only:
        text = report(json.loads(data_file(out, "kv8.json").read_text()), out)
        (out / "kv8.md").write_text(text)
        print(text, end="")
        return 0

    model, tokenizer = load_model(None, device="cpu", dtype="float32", weights="dense")
    text = real_text(Path(args.corpus))
    ids = tokenizer(text[200_000:], add_special_tokens=False)["input_ids"][: args.context + args.steps]
    exact, exact_bytes, _ = measure(model, ids, args.context, args.steps, None)
    rows = []
    for kv_dtype in ("int8", "fp8"):
        coded, coded_bytes, seconds = measure(model, ids, args.context, args.steps, kv_dtype)
        kl = (exact.exp() * (exact - coded)).sum(-1)  # nats, per position
        agree = (exact.argmax(-1) == coded.argmax(-1)).double()
        rows.append({"kv_dtype": kv_dtype, "mean_kl_nats": float(kl.mean()), "max_kl_nats": float(kl.max()),
                     "top1_agreement": float(agree.mean()), "kv_bytes": coded_bytes, "exact_kv_bytes": exact_bytes,
                     "decode_seconds": seconds})
        logger.info("%s", rows[-1])
    out.mkdir(parents=True, exist_ok=True)
    data = {"run": run_stamp("cpu"), "context": args.context, "steps": args.steps, "rows": rows}
    data_file(out, "kv8.json").write_text(json.dumps(data, indent=1, default=str))
    text = report(data, out)
    (out / "kv8.md").write_text(text)
    print(text, end="")
    return 0


def report(data: dict, out: Path) -> str:
    """kv8.md: the quality table, then the needle-in-a-haystack grid on 8-bit KV where niah-<dtype>.json exists."""
    lines = ["# 8-bit host KV — quality on real text (SmolLM2-135M, CPU, fp32 model)", "",
             f"Debian Reference (PDF via the app's reader), {data['context']} tokens read, then {data['steps']} of "
             "its next tokens fed one at a time; exact KV vs 8-bit KV on the same positions. Lossy by design: targets "
             "mean KL <= 0.02 nats and top-1 agreement >= 95%.", "",
             "| KV | mean KL (nats) | max KL | top-1 agreement | KV bytes vs exact |", "|---|---:|---:|---:|---:|"]
    for r in data["rows"]:
        lines.append(f"| {r['kv_dtype']} | {r['mean_kl_nats']:.4f} | {r['max_kl_nats']:.3f} | "
                     f"{r['top1_agreement']:.1%} | {r['kv_bytes'] / r['exact_kv_bytes']:.2f}x |")
    niah = niah_lines(out)
    if niah:
        lines += ["", "## Needle in a haystack on 8-bit KV (target: the grid unchanged)", "", *niah]
    return "\n".join(lines) + "\n"


def niah_lines(out: Path) -> list[str]:
    """One line per 8-bit NIAH run (niah-int8.json, niah-fp8.json) against the exact grid (niah.json)."""
    if not data_file(out, "niah.json").is_file():
        return []
    exact = json.loads(data_file(out, "niah.json").read_text())["cells"]
    lines = []
    for kv_dtype in ("int8", "fp8"):
        path = data_file(out, f"niah-{kv_dtype}.json")
        if not path.is_file():
            continue
        cells = json.loads(path.read_text())["cells"]
        pairs = [(c, e) for c in cells if (e := same_cell(c, exact)) is not None]
        same = sum(c["found"] == e["found"] and c["top_source"] == e["top_source"] for c, e in pairs)
        found = [c for c in cells if c["found"]]
        top1 = sum(c["top_source"] == c["needle_page"] for c in found)
        exact_found = sum(e["found"] for _, e in pairs)
        lines.append(f"- {kv_dtype} (`niah-{kv_dtype}.md`): same outcome (found, top source) as exact KV in "
                     f"{same}/{len(pairs)} cells; needle found {len(found)}/{len(cells)} vs {exact_found}/{len(pairs)} "
                     f"exact; top source = the needle's page {top1}/{len(found)}; greedy tokens identical to stock "
                     f"{sum(c['identical'] for c in cells)}/{len(cells)}")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
