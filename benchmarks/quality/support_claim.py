"""The claim check as a support signal, on the four manuals' cached answers (the CPU default model).

    nice -n 10 python -m benchmarks.quality.support_claim [--model qwen2.5-coder-1.5b] [--variants after,quoted]

Reuses the answers ``support_eval`` (``data/support.jsonl``) and ``support_held_out`` (``data/support-held-out.jsonl``)
recorded: no answer is generated again. Each manual is read once (restored from a snapshot under ``--kv`` when one
was saved); then per answer one short prefill and one next-token distribution per variant
(``DocumentSession.check_support`` with ``support_claim.claim_prompt``):

- ``after``: the question and the recorded answer as the conversation so far (re-read here; cached in the app), then
  "does the document give that answer for exactly what was asked?";
- ``quoted``: a fresh chat on the document, the question and the answer quoted in the turn.

One line per answer to ``data/support-claim.jsonl`` (resumable); ``support_held_out --tables-only`` fits and reports
them held out by manual.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from engine import DocumentSession, OffloadPolicy, SnapshotStore
from engine.answer.support_claim import claim_prompt
from engine.models.weights_mode import weights_mode
from engine.prompt import Turn

from ..records import append_jsonl
from .model_eval import load, read_or_restore
from .support_held_out import ANSWERS, DATA, FITTED_ANSWERS, MODEL, fitted_records
from .support_held_out import load_questions as held_out_questions

logger = logging.getLogger(__name__)

CLAIMS = DATA / "data" / "support-claim.jsonl"
VARIANTS = ("after", "quoted")


def answers_to_check(model: str) -> list[dict]:
    """The fresh glued answers of ``model`` on the four manuals, the held-out manuals' first."""
    held = [json.loads(line) for line in ANSWERS.read_text().splitlines()] if ANSWERS.is_file() else []
    return [r for r in held if r["model"] == model] + fitted_records(model, FITTED_ANSWERS)


def check(session: DocumentSession, record: dict, variants: tuple[str, ...]) -> dict:
    """The claim check's P(yes) and seconds per variant for one recorded answer."""
    found = {}
    for variant in variants:
        session.new_conversation()
        started = time.perf_counter()
        if variant == "after":
            turns = [Turn(record["question"], record["answer"])]
            found["yes_after"] = session.check_support(record["question"], turns, claim_prompt(record["question"]))
        else:
            prompt = claim_prompt(record["question"], record["answer"])
            found["yes_quoted"] = session.check_support(record["question"], [], prompt)
        found[f"yes_{variant}"] = round(found[f"yes_{variant}"], 5)
        found[f"check_s_{variant}"] = round(time.perf_counter() - started, 2)
    session.new_conversation()
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality.support_claim")
    p.add_argument("--model", default=MODEL)
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "headinfer-studio" / "eval-docs"))
    p.add_argument("--kv", default=str(Path.home() / ".cache" / "headinfer-studio" / "eval-kv"))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", default=str(CLAIMS))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .support_eval import load_questions as fitted_questions

    variants = tuple(v for v in args.variants.split(",") if v)
    out = Path(args.out)
    done = {(r["document"], r["question"]) for r in map(json.loads, out.read_text().splitlines())} \
        if out.is_file() else set()
    todo = [r for r in answers_to_check(args.model) if (r["document"], r["question"]) not in done]
    documents = {d["key"]: d for d in held_out_questions() + fitted_questions()}
    model, tokenizer, _, _, load_s = load(args.model, "auto")
    logger.info("%s loaded in %.0f s; %d answers to check", args.model, load_s, len(todo))
    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=1024))
    store = SnapshotStore(args.kv)
    for key in dict.fromkeys(r["document"] for r in todo):
        read_or_restore(session, documents[key], Path(args.cache), store, f"support-claim {args.model} {key}")
        for record in (r for r in todo if r["document"] == key):
            found = check(session, record, variants)
            line = {"model": args.model, "weights": weights_mode(model), "document": key,
                    "question": record["question"], "kind": record["kind"], **found, "at": round(time.time(), 1)}
            logger.info("%s", line)
            append_jsonl(out, line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
