"""Needle in a haystack on the embedded SmolLM2, up to its 8K window: exactness, recall and sources.

    python -m benchmarks.niah                       # full grid (CPU: tens of minutes)
    python -m benchmarks.niah --lengths 1K,2K --depths 0,0.5,1

For every (length, depth) cell a paged haystack ("[page N]" markers) hides "The secret passphrase is X." on
one page; the model is asked for it. Each cell records whether head-wise decoding gives the very tokens
stock transformers gives (greedy), whether the answer contains the needle, the top attention-grounded
source page against the needle's page, and the sources' cost against the answer's decode time.
Writes docs/benchmarks/niah.{json,md} and a heatmap niah.png.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time
from pathlib import Path

import torch

from .records import run_stamp
from .run import parse_tokens

logger = logging.getLogger(__name__)

SENTENCES_PER_PAGE = 12
QUESTION = "What is the secret passphrase? Answer with the passphrase only."


def paged_haystack(tokenizer, num_tokens: int, depth: float, seed: int) -> tuple[str, str, int]:
    """(document, needle value, needle page) of about ``num_tokens`` tokens."""
    from engine.retrieval_heads import _FILLER, _WORDS

    rng = random.Random(seed)
    value = f"{rng.choice(_WORDS)}-{rng.choice(_WORDS)}-{rng.randrange(100, 999)}"
    per_sentence = len(tokenizer(" ".join(_FILLER), add_special_tokens=False)["input_ids"]) / len(_FILLER)
    num_sentences = max(SENTENCES_PER_PAGE, int(num_tokens / (per_sentence + 0.3)))
    sentences = [rng.choice(_FILLER) for _ in range(num_sentences)]
    at = min(int(depth * num_sentences), num_sentences - 1)
    sentences.insert(at, f"The secret passphrase is {value}.")
    pages = [sentences[i : i + SENTENCES_PER_PAGE] for i in range(0, len(sentences), SENTENCES_PER_PAGE)]
    document = "\n\n".join(f"[page {n}]\n" + " ".join(page) for n, page in enumerate(pages, start=1))
    return document, value, at // SENTENCES_PER_PAGE + 1


@torch.inference_mode()
def run_cell(model, tokenizer, heads, length: int, depth: float, *, max_new_tokens: int, chunk: int) -> dict:
    import engine
    from engine.prompt import PromptBuilder
    from engine.sources import AnswerSources, page_starts

    from .models import set_attention

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
    # Head-wise: chunked prefill, greedy decode, sources from the calibrated heads.
    set_attention(model, "headinfer")
    cache = engine.HeadInferCache(model.config, device="cpu", chunk_size=chunk)
    cache.allocate(1, cache.shape.head_dim, next(model.parameters()).dtype, torch.device("cpu"))
    grounding = AnswerSources(cache, heads, (0, len(doc_ids)), page_starts(tokenizer, prompts.document_text(document)))
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
    return {"length": len(ids), "target": length, "depth": depth, "needle_page": needle_page,
            "answer": answer, "found": value.lower() in answer.lower(), "identical": tokens == stock_tokens,
            "top_source": sources[0].page if sources else None,
            "sources": [(s.page, round(s.share, 3)) for s in sources],
            "prefill_s": prefill_seconds, "decode_s": decode_seconds, "answer_tokens": len(tokens),
            "sources_s": grounding.seconds, "sources_cost": grounding.seconds / max(decode_seconds, 1e-9)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.niah")
    p.add_argument("--lengths", default="1K,2K,4K,7.5K")
    p.add_argument("--depths", default="0,0.25,0.5,0.75,1")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--chunk-size", type=int, default=2048)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="docs/benchmarks")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    from engine.loader import cache_dir, load_model
    from engine.retrieval_heads import find_retrieval_heads

    model, tokenizer = load_model(None, device="cpu", dtype="float32")
    heads = find_retrieval_heads(model, tokenizer, cache_dir=cache_dir())
    cells = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for length in parse_tokens(args.lengths):
        for depth in (float(d) for d in args.depths.split(",")):
            cell = run_cell(model, tokenizer, heads, length, depth, max_new_tokens=args.max_new_tokens,
                            chunk=args.chunk_size)
            logger.info("%s", cell)
            cells.append(cell)
            (out / "niah.json").write_text(json.dumps({"run": run_stamp("cpu"), "heads": heads, "cells": cells},
                                                      indent=1, default=str))
    text = report(cells, heads)
    (out / "niah.md").write_text(text)
    heatmap(cells, out / "niah.png")
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


def heatmap(cells: list[dict], path: Path) -> None:
    import matplotlib

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
    ax.set_title("needle found (+ top source on its page)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
