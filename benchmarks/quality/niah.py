"""Needle in a haystack on the embedded SmolLM2, up to its 8K window: exactness, recall and sources.

    python -m benchmarks.quality.niah                       # full grid (CPU: tens of minutes)
    python -m benchmarks.quality.niah --lengths 1K,2K --depths 0,0.5,1
    python -m benchmarks.quality.niah --kv-dtype int8          # head-wise side on lossy 8-bit KV, compared to niah.json

For every (length, depth) cell a paged haystack ("[page N]" markers) hides "The secret passphrase is X." on
one page; the model is asked for it. Each cell records whether head-wise decoding gives the very tokens
stock transformers gives (greedy), whether the answer contains the needle, the top attention-grounded
source page against the needle's page, and the sources' cost against the answer's decode time.
Writes docs/benchmarks/niah.md, data/niah.json and a heatmap data/niah.png. With ``--kv-dtype int8`` / ``fp8`` the
head-wise side keeps its KV in 8 bits (``OffloadPolicy.kv_dtype``, lossy) and the files are niah-int8.* / niah-fp8.*; the
report then compares every cell with the exact grid in niah.json ("identical" stays: greedy tokens identical to
stock transformers on exact KV).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time
from pathlib import Path

import torch

import engine
from engine.answer.retrieval_heads import _FILLER, _WORDS, find_retrieval_heads
from engine.answer.sources import AnswerSources, page_starts_from_offsets
from engine.models.loader import load_model
from engine.paths import cache_dir
from engine.prompt import PromptBuilder
from engine.types import page_marker, page_markers

from ..harness.models import set_attention
from ..records import run_stamp
from ..harness.layout import data_file
from ..harness.run import parse_tokens

logger = logging.getLogger(__name__)

SENTENCES_PER_PAGE = 12
QUESTION = "What is the secret passphrase? Answer with the passphrase only."


def paged_haystack(tokenizer, num_tokens: int, depth: float, seed: int) -> tuple[str, str, str]:
    """(document, needle value, needle page) of about ``num_tokens`` tokens."""
    rng = random.Random(seed)
    value = f"{rng.choice(_WORDS)}-{rng.choice(_WORDS)}-{rng.randrange(100, 999)}"
    per_sentence = len(tokenizer(" ".join(_FILLER), add_special_tokens=False)["input_ids"]) / len(_FILLER)
    num_sentences = max(SENTENCES_PER_PAGE, int(num_tokens / (per_sentence + 0.3)))
    sentences = [rng.choice(_FILLER) for _ in range(num_sentences)]
    at = min(int(depth * num_sentences), num_sentences - 1)
    sentences.insert(at, f"The secret passphrase is {value}.")
    pages = [sentences[i : i + SENTENCES_PER_PAGE] for i in range(0, len(sentences), SENTENCES_PER_PAGE)]
    document = "\n\n".join(f"{page_marker(n, n)}\n" + " ".join(page) for n, page in enumerate(pages, start=1))
    return document, value, str(at // SENTENCES_PER_PAGE + 1)  # the page as its marker labels it


@torch.inference_mode()
def run_cell(model, tokenizer, heads, length: int, depth: float, *, max_new_tokens: int, chunk: int,
             kv_dtype: str | None = None) -> dict:
    document, value, needle_page = paged_haystack(tokenizer, length, depth, seed=int(length + 1000 * depth))
    prompts = PromptBuilder(tokenizer)
    doc_ids = prompts.document_ids(document)
    ids = doc_ids + prompts.conversation_ids(document, [], QUESTION)
    stop = {tokenizer.eos_token_id, *(model.generation_config.eos_token_id if isinstance(
        model.generation_config.eos_token_id, list) else [model.generation_config.eos_token_id])}
    # Stock: sdpa, the whole prompt at once, DynamicCache.
    set_attention(model, "sdpa")
    out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False)
    stock_tokens = [t for t in out[0, len(ids):].tolist()]
    stock_tokens = stock_tokens[: next((i for i, t in enumerate(stock_tokens) if t in stop), len(stock_tokens))]
    # Head-wise: chunked prefill, greedy decode, sources from the calibrated heads (8-bit KV with kv_dtype).
    set_attention(model, "headinfer")
    cache = engine.HeadInferCache(model.config, device="cpu", chunk_size=chunk, kv_dtype=kv_dtype)
    cache.allocate(1, cache.shape.head_dim, next(model.parameters()).dtype, torch.device("cpu"))
    tokens = prompts.tokenize_document(document, page_markers(document))  # our own haystack: its markers are ours
    grounding = AnswerSources(cache, heads, (0, len(doc_ids)), page_starts_from_offsets(tokens.pages, tokens.starts))
    grounding.start(len(ids) - 1)
    started = time.perf_counter()
    for s in range(0, len(ids), chunk):
        logits = model(torch.tensor([ids[s : s + chunk]]), past_key_values=cache, logits_to_keep=1).logits[0, -1]
    prefill_seconds = time.perf_counter() - started
    tokens, started = [], time.perf_counter()
    for _ in range(max_new_tokens):
        token = int(logits.argmax())
        if token in stop:
            break
        tokens.append(token)
        logits = model(torch.tensor([[token]]), past_key_values=cache).logits[0, -1]
    decode_seconds = time.perf_counter() - started
    sources = grounding.finish()
    cache.release()
    answer = tokenizer.decode(tokens, skip_special_tokens=True)
    return {"length": len(ids), "target": length, "depth": depth, "needle_page": needle_page, "kv_dtype": kv_dtype,
            "answer": answer, "found": value.lower() in answer.lower(), "identical": tokens == stock_tokens,
            "top_source": sources[0].page if sources else None,
            "sources": [(s.page, round(s.share, 3)) for s in sources],
            "prefill_s": prefill_seconds, "decode_s": decode_seconds, "answer_tokens": len(tokens),
            "sources_s": grounding.seconds, "sources_cost": grounding.seconds / max(decode_seconds, 1e-9)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality.niah")
    p.add_argument("--lengths", default="1K,2K,4K,7.5K")
    p.add_argument("--depths", default="0,0.25,0.5,0.75,1")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--chunk-size", type=int, default=2048)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--kv-dtype", choices=("int8", "fp8"), default=None,
                   help="head-wise side on lossy 8-bit KV; writes niah-<dtype>.* compared to niah.json (exact)")
    p.add_argument("--out", default="docs/benchmarks")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model(None, device="cpu", dtype="float32", weights="dense")
    heads = find_retrieval_heads(model, tokenizer, cache_dir=cache_dir())
    cells = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "niah" if args.kv_dtype is None else f"niah-{args.kv_dtype}"
    exact = None
    if args.kv_dtype is not None:
        exact = json.loads(data_file(out, "niah.json").read_text())["cells"]  # the grid to compare with: run it first
    started = time.perf_counter()
    for length in parse_tokens(args.lengths):
        for depth in (float(d) for d in args.depths.split(",")):
            cell = run_cell(model, tokenizer, heads, length, depth, max_new_tokens=args.max_new_tokens,
                            chunk=args.chunk_size, kv_dtype=args.kv_dtype)
            logger.info("%s", cell)
            cells.append(cell)
            data_file(out, f"{name}.json").write_text(json.dumps({"run": run_stamp("cpu"), "kv_dtype": args.kv_dtype,
                                                          "heads": heads, "cells": cells,
                                                          "seconds": time.perf_counter() - started},
                                                         indent=1, default=str))
    text = report(cells, heads) if exact is None else report_8bit(cells, heads, exact, args.kv_dtype)
    (out / f"{name}.md").write_text(text)
    heatmap(cells, data_file(out, f"{name}.png"), args.kv_dtype)
    print(text)
    return 0


def report(cells: list[dict], heads: dict) -> str:
    found = [c for c in cells if c["found"]]
    top1 = [c for c in found if c["top_source"] == c["needle_page"]]
    at_8k = [c for c in cells if c["target"] >= 7000] or cells
    lines = [
        "# Needle in a haystack — SmolLM2-135M-Instruct on CPU", "",
        f"Retrieval heads (needle calibration): {heads}", "",
        f"- head-wise answers identical to stock (greedy tokens): {sum(c['identical'] for c in cells)}/{len(cells)}",
        f"- answers containing the needle: {len(found)}/{len(cells)}",
        f"- top source = the needle's page, where the answer has the needle: {len(top1)}/{len(found)}"
        + (f" ({len(top1) / len(found):.0%})" if found else ""),
        f"- sources cost at the longest length: {max(c['sources_cost'] for c in at_8k):.1%} of the answer's decode "
        f"time (max), {sum(c['sources_s'] for c in at_8k) / len(at_8k):.3f} s mean", "",
        "| tokens | depth | needle page | found | identical | top source | sources | answer |",
        "|---:|---:|---:|:--:|:--:|---:|---|---|",
    ]
    for c in cells:
        lines.append(f"| {c['length']} | {c['depth']:.2f} | {c['needle_page']} | {'✓' if c['found'] else '✗'} | "
                     f"{'✓' if c['identical'] else '✗'} | {c['top_source']} | {c['sources']} | {c['answer']!r} |")
    return "\n".join(lines) + "\n"


def same_cell(cell: dict, exact: list[dict]) -> dict | None:
    """The exact run's cell with the same target length and depth (None when the exact grid lacks it)."""
    return next((e for e in exact if e["target"] == cell["target"] and e["depth"] == cell["depth"]), None)


def report_8bit(cells: list[dict], heads: dict, exact: list[dict], kv_dtype: str) -> str:
    """The grid on 8-bit KV, cell by cell against the exact grid (niah.json)."""
    pairs = [(c, same_cell(c, exact)) for c in cells]
    compared = [(c, e) for c, e in pairs if e is not None]
    same_found = [c for c, e in compared if c["found"] == e["found"]]
    same_top = [c for c, e in compared if c["top_source"] == e["top_source"]]
    same = [c for c, e in compared if c["found"] == e["found"] and c["top_source"] == e["top_source"]]
    found = [c for c in cells if c["found"]]
    top1 = [c for c in found if c["top_source"] == c["needle_page"]]
    exact_found = [e for _, e in compared if e["found"]]
    exact_top1 = [e for e in exact_found if e["top_source"] == e["needle_page"]]
    same_answer = [c for c, e in compared if c["answer"] == e["answer"]]
    at_8k = [c for c in cells if c["target"] >= 7000] or cells
    lines = [
        f"# Needle in a haystack — SmolLM2-135M-Instruct on CPU, head-wise on {kv_dtype} KV (LOSSY 8-bit)", "",
        f"The head-wise side keeps K/V in {kv_dtype} with a scale per token and head "
        f"(`OffloadPolicy(kv_dtype=\"{kv_dtype}\")`): lossy by design, answers may differ from the model's own. "
        "Stock transformers (sdpa, exact KV) is the reference as in the exact grid (`niah.md`); every cell is "
        "compared with that exact grid (`data/niah.json`). Same outcome: the same \"found\" and the same top source "
        "as the exact run.", "",
        f"Retrieval heads (needle calibration): {heads}", "",
        f"- cells with the same outcome as exact KV: {len(same)}/{len(compared)} "
        f"(found: {len(same_found)}/{len(compared)}, top source: {len(same_top)}/{len(compared)})",
        f"- answers containing the needle: {len(found)}/{len(cells)} on {kv_dtype} vs "
        f"{len(exact_found)}/{len(compared)} on exact KV",
        f"- top source = the needle's page, where the answer has the needle: {len(top1)}/{len(found)} on {kv_dtype} "
        f"vs {len(exact_top1)}/{len(exact_found)} on exact KV",
        f"- greedy tokens identical to stock (exact KV): {sum(c['identical'] for c in cells)}/{len(cells)} "
        f"(exact head-wise: {sum(e['identical'] for _, e in compared)}/{len(compared)}); answer text the same as "
        f"on exact KV: {len(same_answer)}/{len(compared)}",
        f"- sources cost at the longest length: {max(c['sources_cost'] for c in at_8k):.1%} of the answer's decode "
        f"time (max), {sum(c['sources_s'] for c in at_8k) / len(at_8k):.3f} s mean", "",
        "| tokens | depth | needle page | found | = exact | identical to stock | top source | = exact | sources "
        "| answer |",
        "|---:|---:|---:|:--:|:--:|:--:|---:|:--:|---|---|",
    ]
    for c, e in pairs:
        found_same = "—" if e is None else _mark(c["found"] == e["found"])
        top_same = "—" if e is None else _mark(c["top_source"] == e["top_source"])
        lines.append(f"| {c['length']} | {c['depth']:.2f} | {c['needle_page']} | {_mark(c['found'])} | {found_same} | "
                     f"{_mark(c['identical'])} | {c['top_source']} | {top_same} | {c['sources']} | {c['answer']!r} |")
    return "\n".join(lines) + "\n"


def _mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def heatmap(cells: list[dict], path: Path, kv_dtype: str | None = None) -> None:
    import matplotlib  # optional dependency: plots only where matplotlib is installed

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({c["target"] for c in cells})
    depths = sorted({c["depth"] for c in cells})
    grid = [[next((2 * c["found"] + (c["top_source"] == c["needle_page"]) for c in cells
                   if c["target"] == n and c["depth"] == d), 0) for n in lengths] for d in depths]
    fig, ax = plt.subplots(figsize=(1.2 * len(lengths) + 2, 0.6 * len(depths) + 1.5))
    ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=3, aspect="auto")
    ax.set_xticks(range(len(lengths)), [f"{n // 1024}K" if n >= 1024 else str(n) for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
    ax.set_xlabel("haystack tokens")
    ax.set_ylabel("needle depth")
    ax.set_title("needle found (+ top source on its page)" + (f", {kv_dtype} KV (lossy)" if kv_dtype else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
