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

``--reverse``: the reverse question and the own-token gain instead (``score_reverse``), on the answers ``by_answer``
labels (one saying the document does not say has nothing to flag): the recorded answer teacher-forced under both
questions, kept per token (``support_own_gain.own_token_gain`` reads the answer's own tokens off them; the asked
scoring is checked against the recorded decode's log-probs), and the blank of ``support_reverse.reverse_cloze``
filled by the word asked and by each rival (``teacher_forced.candidate_logprobs``; ``reverse_margin``). The order is
fixed before any score is read: the held-out manuals first, then the fitted ones, each manual's answers as recorded.
One line per answer to ``data/support-reverse.jsonl`` (resumable).

``--reask``: the rival's question asked instead (``score_reask``), on the answers ``by_answer`` labels, in the same
order: ``counterfactual_question`` answered greedily in a fresh conversation on the document's cached K/V as
``support_eval.evaluate`` asks (the glued layout, at most 48 answer tokens, the repetition guard; no sources pass,
which runs after the decode and does not change its text), the conversation left as it was (``reanswer``); the
signal is ``support_reask.reask_overlap``. One line per answer to ``data/support-reask.jsonl`` (resumable).

``--sort-reask``: the same re-ask with the rival of the same sort (``support_sort.sort_question``) as the question
asked again; one line per answer to ``data/support-sort-reask.jsonl`` (resumable).
"""
from __future__ import annotations

import argparse
import functools
import json
import logging
import time
from pathlib import Path

from engine import DocumentSession, OffloadPolicy, SnapshotStore
from engine.answer.support_counterfactual import counterfactual_gain, counterfactual_question
from engine.answer.support_own_gain import own_token_gain
from engine.answer.support_reask import reask_overlap
from engine.answer.support_reverse import reverse_cloze, reverse_margin
from engine.answer.support_sort import sort_question
from engine.answer.teacher_forced import candidate_logprobs, continuation_logprobs
from engine.models.weights_mode import weights_mode

from ..records import append_jsonl
from .model_eval import document_text, load, read_or_restore
from .support_claim import answers_to_check
from .support_eval import MAX_NEW_TOKENS
from .support_held_out import COUNTERFACTUALS, MODEL, REASKS, REVERSES, SORT_REASKS, cited_spans
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


def _rounded(values: list[float]) -> list[float]:
    return [round(v, 5) for v in values]


def score_reverse(session: DocumentSession, record: dict, text: str) -> dict:
    """The own-token gain and the reverse margin, their inputs and their seconds for one recorded answer."""
    spans = cited_spans(text, [page or "" for page, _ in record.get("sources") or []])
    asked = record["question"]
    found: dict = {"own_gain": None, "reverse_margin": None}
    ids = session.tokenizer.encode(record["answer"], add_special_tokens=False)
    tokens = [session.tokenizer.decode([i]) for i in ids]
    swapped = counterfactual_question(asked, record["answer"], text, spans)
    found["counterfactual"] = swapped
    if swapped is not None:
        session.new_conversation()
        started = time.perf_counter()
        under = [continuation_logprobs(session.model, session.cache,
                                       session.prompts.conversation_ids(session.document, [], q), ids)
                 for q in (asked, swapped)]
        found.update(tokens=tokens, asked_logprobs=_rounded(under[0]), swapped_logprobs=_rounded(under[1]),
                     own_gain=own_token_gain(tokens, under[0], under[1], asked),
                     counterfactual_s=round(time.perf_counter() - started, 2))
        recorded = record.get("token_logprobs") or []
        if len(recorded) == len(ids):  # the same tokens as the decode wrote: its log-probs, to compare
            found["max_abs_vs_decode"] = round(max(abs(a - b) for a, b in zip(under[0], recorded)), 5)
    cloze = reverse_cloze(asked, record["answer"], text, spans)
    if cloze is not None:
        session.new_conversation()
        started = time.perf_counter()
        words = [cloze.word, *cloze.rivals]
        scored = candidate_logprobs(session.model, session.cache,
                                    session.prompts.conversation_ids(session.document, [], cloze.prompt),
                                    [session.tokenizer.encode(w, add_special_tokens=False) for w in words])
        found.update(cloze=cloze.prompt, word=cloze.word, rivals=list(cloze.rivals),
                     candidate_logprobs=[round(sum(s), 5) for s in scored],
                     reverse_margin=round(reverse_margin(scored[0], scored[1:]), 5),
                     reverse_s=round(time.perf_counter() - started, 2))
    return found


def reanswer(session: DocumentSession, question: str, max_new_tokens: int = MAX_NEW_TOKENS):
    """The final chunk of ``question`` answered greedily in a fresh conversation on the document's cached K/V, as
    the app answers (no sources pass); the session's conversation is left as it was (its turns and how many the
    last question dropped) and its cache at the document, so the next question sees what it would have."""
    kept, dropped = session.conversation(), session.dropped_turns
    session.new_conversation()
    final = None
    try:
        for final in session.ask(question, max_new_tokens=max_new_tokens, sources=False):
            pass
    finally:
        session.new_conversation()
        session.resume_conversation(kept)
        session.dropped_turns = dropped
    return final


def score_reask(session: DocumentSession, record: dict, text: str, rival=counterfactual_question) -> dict:
    """The rival's question (``rival``'s), the model's answer to it, the overlap and the seconds for one answer."""
    spans = cited_spans(text, [page or "" for page, _ in record.get("sources") or []])
    swapped = rival(record["question"], record["answer"], text, spans)
    found: dict = {"counterfactual": swapped, "reask_overlap": None}
    if swapped is None:
        return found
    started = time.perf_counter()
    final = reanswer(session, swapped)
    found.update(reanswer=final.text, reanswer_tokens=final.num_tokens, reask_s=round(time.perf_counter() - started, 2),
                 reask_overlap=reask_overlap(record["answer"], final.text, record["question"], swapped, text))
    if found["reask_overlap"] is not None:
        found["reask_overlap"] = round(found["reask_overlap"], 5)
    return found


def labelled(model: str) -> list[dict]:
    """The answers ``by_answer`` labels, the held-out manuals' first (``answers_to_check``' order)."""
    from .support_eval import by_answer

    return by_answer(answers_to_check(model))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality.support_counterfactual")
    p.add_argument("--model", default=MODEL)
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "headinfer-studio" / "eval-docs"))
    p.add_argument("--kv", default=str(Path.home() / ".cache" / "headinfer-studio" / "eval-kv"))
    p.add_argument("--documents", default="", help="score only these manuals' answers (comma-separated keys)")
    p.add_argument("--reverse", action="store_true", help="the reverse question and the own-token gain instead")
    p.add_argument("--reask", action="store_true", help="the rival's question asked and answered instead")
    p.add_argument("--sort-reask", action="store_true", help="the re-ask with the rival of the same sort instead")
    p.add_argument("--out", default="", help="the answers' lines (default: the chosen scoring's data file)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .support_eval import load_questions as fitted_questions

    out = Path(args.out or (SORT_REASKS if args.sort_reask else REASKS if args.reask else REVERSES if args.reverse
                            else COUNTERFACTUALS))
    done = {(r["document"], r["question"]) for r in map(json.loads, out.read_text().splitlines())} \
        if out.is_file() else set()
    wanted = set(args.documents.split(",")) if args.documents else None
    answers = labelled(args.model) if args.reverse or args.reask or args.sort_reask else answers_to_check(args.model)
    todo = [r for r in answers if (r["document"], r["question"]) not in done
            and (wanted is None or r["document"] in wanted)]
    documents = {d["key"]: d for d in held_out_questions() + fitted_questions()}
    model, tokenizer, _, _, load_s = load(args.model, "auto")
    logger.info("%s loaded in %.0f s; %d answers to score", args.model, load_s, len(todo))
    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=1024))
    scoring = (functools.partial(score_reask, rival=sort_question) if args.sort_reask else score_reask if args.reask
               else score_reverse if args.reverse else score)
    store = SnapshotStore(args.kv)
    for key in dict.fromkeys(r["document"] for r in todo):
        text = document_text(documents[key], Path(args.cache))
        read_or_restore(session, documents[key], Path(args.cache), store, f"support-counterfactual {args.model} {key}")
        for record in (r for r in todo if r["document"] == key):
            line = {"model": args.model, "weights": weights_mode(model), "document": key,
                    "question": record["question"], "kind": record["kind"], **scoring(session, record, text),
                    "at": round(time.time(), 1)}
            logger.info("%s %s: scored", key, record["question"][:60])
            append_jsonl(out, line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
