"""The verification turn as a support signal: P(yes) that the document states the answer, on the cached document.

    python -m benchmarks.quality.support_verify [--models qwen2.5-coder-1.5b,smollm2] [--out docs/benchmarks]

Reuses the answers ``benchmarks.quality.support_eval`` recorded (``support.jsonl``, fresh chats, glued layout): no answer is
generated again. Each document is read once (restored from a snapshot under ``--kv`` when one was saved); then for
every question two checks, each a short prefill on the document's K/V and one next-token distribution
(``DocumentSession.check_support``):

- ``question``: the check alone in a fresh chat, before any answer (independent of the answer's text): what
  ``DocumentSession.ask`` runs when the check is on;
- ``answer``: the check after the recorded answer (the question and that answer as the conversation so far, re-read
  here; in the app they would already be cached).

One line per question to ``support-verify.jsonl`` (resumable); ``python -m benchmarks.quality.support_eval --tables-only``
fits and reports them beside the other signals.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from engine import DocumentSession, OffloadPolicy, SnapshotStore
from engine.models.weights_mode import weights_mode

from .model_eval import load, read_or_restore
from ..harness.layout import data_file
from ..records import append_jsonl
from .support_eval import load_questions

logger = logging.getLogger(__name__)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality.support_verify")
    p.add_argument("--models", default="qwen2.5-coder-1.5b,smollm2")
    p.add_argument("--weights", default="auto", choices=["dense", "auto", "gguf", "int8"])
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "headinfer-studio" / "eval-docs"))
    p.add_argument("--kv", default=str(Path.home() / ".cache" / "headinfer-studio" / "eval-kv"))
    p.add_argument("--out", default="docs/benchmarks")
    p.add_argument("--variants", default="question,answer", help="which checks to run (question: before any answer)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    out = Path(args.out)
    answers = {(r["model"], r["document"], r["question"]): r
               for r in map(json.loads, (data_file(out, "support.jsonl")).read_text().splitlines())
               if r["layout"] == "glued" and r["chat"] == "fresh"}
    jsonl = data_file(out, "support-verify.jsonl")
    done = {(r["model"], r["document"], r["question"])
            for r in map(json.loads, jsonl.read_text().splitlines())} if jsonl.is_file() else set()
    store = SnapshotStore(args.kv)
    documents = load_questions()
    for key in args.models.split(","):
        model, tokenizer, _, _, load_s = load(key, args.weights)
        logger.info("%s loaded in %.0f s", key, load_s)
        session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=1024))
        for document in documents:
            todo = [q for q in document["questions"] if (key, document["key"], q["q"]) not in done
                    and (key, document["key"], q["q"]) in answers]
            if not todo:
                continue
            read_or_restore(session, document, Path(args.cache), store, f"support-verify {key} {document['key']}")
            for question in todo:
                answer = answers[(key, document["key"], question["q"])]
                record = {"model": key, "weights": weights_mode(model), "document": document["key"],
                          "question": question["q"], "kind": question["kind"]}
                for variant, turns in (("question", []), ("answer", [(question["q"], answer["answer"])])):
                    if variant not in args.variants.split(","):
                        continue
                    session.new_conversation()
                    session.resume_conversation(turns)
                    started = time.perf_counter()
                    record[f"yes_{variant}"] = round(session.check_support(question["q"]), 5)
                    record[f"check_s_{variant}"] = round(time.perf_counter() - started, 2)
                session.new_conversation()
                logger.info("%s %s %s", key, question["kind"][:5], record)
                append_jsonl(jsonl, record)
        del session, model
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
