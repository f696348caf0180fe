"""Does the document support the answer? The support flag's rates, and a fresh chat against a later one.

    python -m benchmarks.support_eval [--models smollm2,qwen2.5-coder-1.5b] [--layouts turn,glued]
                                      [--chats fresh,turns] [--weights auto] [--out docs/benchmarks]

The questions live in ``benchmarks/data/support_eval.json``: over real Debian manuals (fetched and read as
``benchmarks.model_eval`` does), questions the pages answer and questions that look alike but the pages do not.
Each document is read once per prompt layout; each question is asked in a fresh chat and after one earlier turn
(the document's ``warmup`` question with the pages' own answer, given, not generated). Layouts: ``turn`` (each
question a user message of its own, the engine's layout) and ``glued`` (the first question inside the document's
message, the layout before it). Greedy with the app's repetition guard, sources on, at most 48 answer tokens.

Every answer's support signals (``engine.answer.support``) go to ``support.jsonl`` (one line per answer; a killed
run resumes where it stopped). ``support.md``: thresholds fitted per model on the ``fit`` half of the fresh-chat
answers of the ``turn`` layout and reported on the ``test`` half; the rates with the engine's default thresholds;
fresh-chat vs after-turns accuracy per layout; the signal's cost per answer.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from engine import DocumentSession, OffloadPolicy
from engine.answer.support import SupportThresholds, decide, token_logprob
from engine.prompt import PromptBuilder
from engine.store.fingerprint import weights_mode

from .model_eval import document_text, load, score
from .records import run_stamp

logger = logging.getLogger(__name__)

QUESTIONS = Path(__file__).parent / "data" / "support_eval.json"
MAX_NEW_TOKENS = 48
READING = "## Reading"  # the hand-written part of support.md starts at this heading, kept when the tables are rewritten
MAX_SUPPORTED_FLAGGED = 0.10  # the target: at most this share of supported answers flagged


def load_questions(path: Path = QUESTIONS) -> list[dict]:
    return json.loads(path.read_text())["documents"]


def _key(r: dict) -> tuple:
    return r["model"], r["weights"], r["layout"], r["chat"], r["document"], r["question"]


def evaluate(key: str, weights: str, layouts: list[str], chats: list[str], documents: list[dict],
             texts: dict[str, str], done: set, emit) -> None:
    model, tokenizer, title, _, _ = load(key, weights)
    weights = weights_mode(model)
    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=1024))
    for layout in layouts:
        session.prompts = PromptBuilder(tokenizer, question_turn=layout == "turn")
        for document in documents:
            todo = [(q, chat) for q in document["questions"] for chat in chats
                    if (key, weights, layout, chat, document["key"], q["q"]) not in done]
            if not todo:
                continue
            session.set_document(session.tokenize(texts[document["key"]]))
            session.prefill()
            warmup = document["warmup"]
            for question, chat in todo:
                session.new_conversation()
                if chat == "turns":
                    session.resume_conversation([(warmup["q"], warmup["a"])])
                asked = time.perf_counter()
                final = None
                for final in session.ask(question["q"], max_new_tokens=MAX_NEW_TOKENS, sources=True):
                    pass
                support = final.support
                record = {"model": key, "weights": weights, "title": title, "layout": layout, "chat": chat,
                          "document": document["key"], "question": question["q"], "kind": question["kind"],
                          "half": question["half"], "answer": final.text, "correct": score(final.text, question["regex"]),
                          "document_share": support.document_share, "mean_logprob": support.mean_logprob,
                          "is_supported": support.is_supported, "answer_tokens": final.num_tokens,
                          "sources_s": round(final.sources_seconds, 4), "answer_s": round(time.perf_counter() - asked, 2),
                          "logprob_ms_per_token": _logprob_cost(model)}
                logger.info("%s %s/%s %s %s share=%s lp=%s -> %r", key, layout, chat, question["kind"][:5],
                            "supported" if support.is_supported else "FLAGGED", support.document_share,
                            support.mean_logprob, final.text[:80])
                emit(record)
    del session, model


def _logprob_cost(model) -> float:
    """Milliseconds of ``token_logprob`` on logits of the model's vocabulary size (the per-token signal cost)."""
    logits = torch.randn(model.config.get_text_config(decoder=True).vocab_size)
    started = time.perf_counter()
    for _ in range(20):
        token_logprob(logits, 0)
    return round(1000 * (time.perf_counter() - started) / 20, 3)


def _flag_rates(records: list[dict], thresholds: SupportThresholds) -> tuple[float, float, int, int]:
    """(unsupported flagged, supported flagged, number unsupported, number supported)."""
    flagged = {"supported": [], "unsupported": []}
    for r in records:
        flagged[r["kind"]].append(not decide(r["document_share"], r["mean_logprob"], thresholds).is_supported)
    rate = {k: sum(v) / len(v) if v else float("nan") for k, v in flagged.items()}
    return rate["unsupported"], rate["supported"], len(flagged["unsupported"]), len(flagged["supported"])


def fit_thresholds(records: list[dict]) -> SupportThresholds:
    """The thresholds that flag the most unsupported answers while flagging at most ``MAX_SUPPORTED_FLAGGED`` of
    the supported ones (ties: fewer supported flagged), over the records' own values (and 'off')."""
    shares = sorted({0.0} | {r["document_share"] + 1e-9 for r in records if r["document_share"] is not None})
    logprobs = sorted({-100.0} | {r["mean_logprob"] + 1e-9 for r in records if r["mean_logprob"] is not None})
    best, best_score = SupportThresholds(0.0, -100.0), (-1.0, 0.0)
    for share in shares:
        for logprob in logprobs:
            candidate = SupportThresholds(min(share, 1.0), min(logprob, 0.0))
            unsupported, supported, _, _ = _flag_rates(records, candidate)
            if supported <= MAX_SUPPORTED_FLAGGED and (unsupported, -supported) > best_score:
                best, best_score = candidate, (unsupported, -supported)
    return best


def write_markdown(records: list[dict], stamp: dict, path: Path) -> None:
    models = list(dict.fromkeys(r["model"] for r in records))
    lines = ["# The document may not say: the support flag, and a fresh chat against a later one (CPU)", "",
             f"Machine: {stamp['machine']}, load average at start {stamp['load_avg']} (2 cores shared with other "
             f"jobs); torch {stamp['torch']}, transformers {stamp['transformers']}; {stamp['date'][:10]}.", "",
             "`python -m benchmarks.support_eval`: `benchmarks/data/support_eval.json`, two sections of Debian "
             "manuals (Bash Reference Manual PDF pp. 38-41, Debian FAQ PDF pp. 27-29), 16 questions the pages answer "
             "and 16 that look alike but the pages do not (another program's option, a number or default the pages "
             "do not give), split in halves of 8 + 8. Greedy, sources on, at most "
             f"{MAX_NEW_TOKENS} answer tokens.", "",
             "## The flag (fresh chats, the engine's prompt layout)", "",
             "Thresholds fitted per model on the `fit` half (most unsupported flagged with at most "
             f"{MAX_SUPPORTED_FLAGGED:.0%} of supported flagged), rates reported on the held-out `test` half. "
             "Flagged when the answer's attention share on the pages or its mean token log-probability is under its "
             "threshold. Target: >= 70% of unsupported flagged, <= 10% of supported flagged.", "",
             "| model | fitted thresholds (share, log-prob) | test: unsupported flagged | test: supported flagged | "
             "all, engine defaults: unsupported / supported flagged | unsupported answers that say so themselves |",
             "| --- | --- | --- | --- | --- | --- |"]
    for model in models:
        rows = [r for r in records if r["model"] == model and r["layout"] == "turn" and r["chat"] == "fresh"]
        if not rows:
            continue
        fitted = fit_thresholds([r for r in rows if r["half"] == "fit"])
        u, s, nu, ns = _flag_rates([r for r in rows if r["half"] == "test"], fitted)
        du, ds, dnu, dns = _flag_rates(rows, SupportThresholds())
        declined = [r["correct"] for r in rows if r["kind"] == "unsupported"]
        lines.append(f"| {model} | {fitted.min_document_share:.3f}, {fitted.min_mean_logprob:.2f} | "
                     f"{u:.0%} of {nu} | {s:.0%} of {ns} | {du:.0%} of {dnu} / {ds:.0%} of {dns} | "
                     f"{sum(declined)}/{len(declined)} |")
    lines += ["", "Signal values (mean over answers, fresh chats, engine layout):", "",
              "| model | kind | document share | mean log-prob | right answers |", "| --- | --- | --- | --- | --- |"]
    for model in models:
        for kind in ("supported", "unsupported"):
            rows = [r for r in records if r["model"] == model and r["layout"] == "turn" and r["chat"] == "fresh"
                    and r["kind"] == kind]
            shares = [r["document_share"] for r in rows if r["document_share"] is not None]
            logprobs = [r["mean_logprob"] for r in rows if r["mean_logprob"] is not None]
            if rows:
                lines.append(f"| {model} | {kind} | {sum(shares) / max(len(shares), 1):.3f} | "
                             f"{sum(logprobs) / max(len(logprobs), 1):.2f} | {sum(r['correct'] for r in rows)}/{len(rows)} |")
    lines += ["", "## A fresh chat against a later one", "",
              "Right answers over the questions asked both ways (all 32 in a full run; a supported one: its regex; an unsupported one: the answer says "
              "the document does not say). `glued`: the first question inside the document's message (before); "
              "`turn`: every question its own user message after the document's (after). After turns: one earlier "
              "turn (the document's warm-up question and its answer) before the question.", "",
              "| model | layout | fresh chat | after turns |", "| --- | --- | --- | --- |"]
    for model in models:
        for layout in ("glued", "turn"):
            # Paired: only questions asked both ways (a run cut short compares like with like).
            by_chat = {chat: {r["question"]: r["correct"] for r in records
                              if r["model"] == model and r["layout"] == layout and r["chat"] == chat}
                       for chat in ("fresh", "turns")}
            both = by_chat["fresh"].keys() & by_chat["turns"].keys()
            cells = [f"{sum(by_chat[chat][q] for q in both)}/{len(both)}" if both else "–" for chat in by_chat]
            lines.append(f"| {model} | {layout} | {cells[0]} | {cells[1]} |")
    lines += ["", "## Cost per answer", "",
              "The sources pass runs for every answer anyway (its time below); the support signal adds a sum over "
              "its mass and one log-softmax over the vocabulary per answer token.", "",
              "| model | answers | mean answer s | mean sources pass s | log-softmax ms per token | tokens per answer |",
              "| --- | --- | --- | --- | --- | --- |"]
    for model in models:
        rows = [r for r in records if r["model"] == model]
        n = len(rows)
        lines.append(f"| {model} | {n} | {sum(r['answer_s'] for r in rows) / n:.1f} | "
                     f"{sum(r['sources_s'] for r in rows) / n:.3f} | "
                     f"{sum(r['logprob_ms_per_token'] for r in rows) / n:.2f} | "
                     f"{sum(r['answer_tokens'] for r in rows) / n:.1f} |")
    previous = path.read_text() if path.is_file() else ""
    reading = previous[previous.index(READING):] if READING in previous else ""
    path.write_text("\n".join(lines) + "\n" + ("\n" + reading if reading else ""))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.support_eval")
    p.add_argument("--models", default="smollm2,qwen2.5-coder-1.5b")
    p.add_argument("--layouts", default="turn,glued")
    p.add_argument("--chats", default="fresh,turns")
    p.add_argument("--weights", default="auto", choices=["dense", "auto", "gguf", "int8"])
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "headinfer-studio" / "eval-docs"))
    p.add_argument("--out", default="docs/benchmarks")
    p.add_argument("--documents", default="", help="only these document keys (comma-separated; default all)")
    p.add_argument("--tables-only", action="store_true", help="rewrite support.md from support.jsonl, no model")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    documents = load_questions()
    if args.documents:
        documents = [d for d in documents if d["key"] in args.documents.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "support.jsonl"
    records = [json.loads(line) for line in jsonl.read_text().splitlines()] if jsonl.is_file() else []
    done = {_key(r) for r in records}
    stamp = run_stamp("cpu")

    def emit(record: dict) -> None:
        records.append(record)
        with jsonl.open("a") as f:
            f.write(json.dumps(record) + "\n")

    if args.tables_only:
        write_markdown(records, stamp, out / "support.md")
        return 0
    texts = {d["key"]: document_text(d, Path(args.cache)) for d in documents}
    for key in args.models.split(","):
        evaluate(key, args.weights, args.layouts.split(","), args.chats.split(","), documents, texts, done, emit)
        write_markdown(records, stamp, out / "support.md")
    if records:
        write_markdown(records, stamp, out / "support.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
