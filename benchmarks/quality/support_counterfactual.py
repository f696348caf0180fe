"""The counterfactual question as a support signal, on the four manuals' cached answers (the CPU default model).

    nice -n 10 python -m benchmarks.quality.support_counterfactual [--model qwen2.5-coder-1.5b] [--documents a,b]

Reuses the answers ``support_eval`` and ``support_held_out`` recorded: no answer is generated again. Each manual is
read once (restored from a snapshot under ``--kv`` when one was saved); then per answer two teacher-forced scorings
of the recorded answer on the document's cached K/V (``teacher_forced.continuation_logprobs``): under the question
asked and under ``support_counterfactual.counterfactual_question`` (its names and versions swapped for the
competing entity nearest the answer's words on its cited pages, or dropped). The gain (mean log-prob asked minus
counterfactual) is the signal.

One line per answer to ``data/support-counterfactual.jsonl`` (resumable); ``support_held_out --tables-only`` fits
and reports it held out by manual.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from engine import DocumentSession, OffloadPolicy, SnapshotStore
from engine.answer.support_counterfactual import counterfactual_gain, counterfactual_question
from engine.answer.teacher_forced import continuation_logprobs
from engine.models.weights_mode import weights_mode

from ..records import append_jsonl
from .model_eval import document_text, load, read_or_restore
from .support_claim import answers_to_check
from .support_held_out import COUNTERFACTUALS, MODEL, cited_spans
from .support_held_out import load_questions as held_out_questions

logger = logging.getLogger(__name__)


def score(session: DocumentSession, record: dict, text: str) -> dict:
    """The counterfactual question, both mean log-probs, the gain and the seconds for one recorded answer."""
    labels = [page or "" for page, _ in record.get("sources") or []]
    asked = record["question"]
    swapped = counterfactual_question(asked, record["answer"], text, cited_spans(text, labels))
    found = {"counterfactual": swapped, "gain": None}
    if swapped is None:
        return found
    session.new_conversation()
    target = session.tokenizer.encode(record["answer"], add_special_tokens=False)
    started = time.perf_counter()
    scores = [continuation_logprobs(session.model, session.cache,
                                    session.prompts.conversation_ids(session.document, [], question), target)
              for question in (asked, swapped)]
    found.update(mean_asked=round(sum(scores[0]) / len(target), 5), mean_counterfactual=round(sum(scores[1]) /
                 len(target), 5), gain=round(counterfactual_gain(*scores), 5), answer_tokens=len(target),
                 score_s=round(time.perf_counter() - started, 2))
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality.support_counterfactual")
    p.add_argument("--model", default=MODEL)
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "headinfer-studio" / "eval-docs"))
    p.add_argument("--kv", default=str(Path.home() / ".cache" / "headinfer-studio" / "eval-kv"))
    p.add_argument("--documents", default="", help="score only these manuals' answers (comma-separated keys)")
    p.add_argument("--out", default=str(COUNTERFACTUALS))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .support_eval import load_questions as fitted_questions

    out = Path(args.out)
    done = {(r["document"], r["question"]) for r in map(json.loads, out.read_text().splitlines())} \
        if out.is_file() else set()
    wanted = set(args.documents.split(",")) if args.documents else None
    todo = [r for r in answers_to_check(args.model) if (r["document"], r["question"]) not in done
            and (wanted is None or r["document"] in wanted)]
    documents = {d["key"]: d for d in held_out_questions() + fitted_questions()}
    model, tokenizer, _, _, load_s = load(args.model, "auto")
    logger.info("%s loaded in %.0f s; %d answers to score", args.model, load_s, len(todo))
    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=1024))
    store = SnapshotStore(args.kv)
    for key in dict.fromkeys(r["document"] for r in todo):
        text = document_text(documents[key], Path(args.cache))
        read_or_restore(session, documents[key], Path(args.cache), store, f"support-counterfactual {args.model} {key}")
        for record in (r for r in todo if r["document"] == key):
            line = {"model": args.model, "weights": weights_mode(model), "document": key,
                    "question": record["question"], "kind": record["kind"], **score(session, record, text),
                    "at": round(time.time(), 1)}
            logger.info("%s", line)
            append_jsonl(out, line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
