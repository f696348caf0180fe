"""Does the document support the answer? The support flag's rates, and a fresh chat against a later one.

    python -m benchmarks.quality.support_eval [--models smollm2,qwen2.5-coder-1.5b] [--layouts turn,glued]
                                      [--chats fresh,turns] [--weights auto] [--out docs/benchmarks]

The questions live in ``benchmarks/data/support_eval.json``: over real Debian manuals (fetched and read as
``benchmarks.quality.model_eval`` does), questions the pages answer and questions that look alike but the pages do not.
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
import contextlib
import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch

from engine import DocumentSession, OffloadPolicy
from engine.answer.support import (SupportThresholds, asked_share, claim_indices, document_words, grounded_share,
                                   page_texts, token_logprob)
from engine.prompt import PromptBuilder
from engine.models.weights_mode import weights_mode
from engine.types import page_markers

from .model_eval import document_text, load, score
from ..harness.layout import data_file
from ..records import append_jsonl, run_stamp

logger = logging.getLogger(__name__)

QUESTIONS = Path(__file__).resolve().parents[1] / "data" / "support_eval.json"
MAX_NEW_TOKENS = 48
READING = "## Reading"  # the hand-written part of support.md starts at this heading, kept when the tables are rewritten
MAX_SUPPORTED_FLAGGED = 0.10  # the target: at most this share of supported answers flagged


def load_questions(path: Path = QUESTIONS) -> list[dict]:
    return json.loads(path.read_text())["documents"]


def _key(r: dict) -> tuple:
    return r["model"], r["weights"], r["layout"], r["chat"], r["document"], r["question"]


def evaluate(key: str, weights: str, layouts: list[str], chats: list[str], documents: list[dict],
             texts: dict[str, str], done: set, emit, turns_kinds: tuple[str, ...] = ("supported", "unsupported"),
             kinds: tuple[str, ...] = ("supported", "unsupported"), observe=None) -> None:
    """Asks each document's questions (``observe(session, record)``, if given, adds to each record before ``emit``)."""
    model, tokenizer, title, _, load_s = load(key, weights)
    logger.info("%s loaded in %.0f s", key, load_s)
    weights = weights_mode(model)
    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=1024))
    for layout in layouts:
        session.prompts = PromptBuilder(tokenizer, question_turn=layout == "turn")
        for document in documents:
            todo = [(q, chat) for q in document["questions"] for chat in chats
                    if (key, weights, layout, chat, document["key"], q["q"]) not in done
                    and q["kind"] in kinds and (chat == "fresh" or q["kind"] in turns_kinds)]
            if not todo:
                continue
            text = texts[document["key"]]
            session.set_document(session.tokenize(text, page_markers(text)))  # the eval's own texts
            started = time.perf_counter()
            session.prefill()
            logger.info("%s %s read %s in %.0f s", key, layout, document["key"], time.perf_counter() - started)
            warmup = document["warmup"]
            for question, chat in todo:
                session.new_conversation()
                if chat == "turns":
                    session.resume_conversation([(warmup["q"], warmup["a"])])
                asked = time.perf_counter()
                final = None
                with _capturing_logprobs() as token_logprobs:
                    for final in session.ask(question["q"], max_new_tokens=MAX_NEW_TOKENS, sources=True):
                        pass
                support = final.support
                record = {"model": key, "weights": weights, "title": title, "layout": layout, "chat": chat,
                          "document": document["key"], "question": question["q"], "kind": question["kind"],
                          "half": question["half"], "answer": final.text, "correct": score(final.text, question["regex"]),
                          "document_share": support.document_share, "mean_logprob": support.mean_logprob,
                          "is_supported": support.is_supported, "answer_tokens": final.num_tokens,
                          "sources_s": round(final.sources_seconds, 4), "answer_s": round(time.perf_counter() - asked, 2),
                          "logprob_ms_per_token": _logprob_cost(model),
                          # The raw material of other candidate signals (fitted offline, ``support_features``).
                          "token_logprobs": [round(x, 4) for x in token_logprobs],
                          # The answer's tokens as text (the claim-token signals; re-tokenized, as the text streams).
                          "tokens": [tokenizer.decode([i])
                                     for i in tokenizer(final.text, add_special_tokens=False)["input_ids"]],
                          "sources": [[s.page, round(s.share, 4)] for s in final.sources]}
                logger.info("%s %s/%s %s %s share=%s lp=%s -> %r", key, layout, chat, question["kind"][:5],
                            "supported" if support.is_supported else "FLAGGED", support.document_share,
                            support.mean_logprob, final.text[:80])
                if observe is not None:
                    observe(session, record)
                emit(record)
    del session, model


@contextlib.contextmanager
def _capturing_logprobs():
    """The answer's per-token log-probabilities, as the session hands them to ``mean_logprob``."""
    import engine.session as session_module

    captured: list[float] = []
    original = session_module.mean_logprob

    def capture(logprobs):
        captured[:] = list(logprobs)
        return original(logprobs)

    session_module.mean_logprob = capture
    try:
        yield captured
    finally:
        session_module.mean_logprob = original


def _logprob_cost(model) -> float:
    """Milliseconds of ``token_logprob`` on logits of the model's vocabulary size (the per-token signal cost)."""
    logits = torch.randn(model.config.get_text_config(decoder=True).vocab_size)
    started = time.perf_counter()
    for _ in range(20):
        token_logprob(logits, 0)
    return round(1000 * (time.perf_counter() - started) / 20, 3)


# The engine's thresholds (``SupportThresholds``, ``decide``), each with (its value when off, lowest, highest): a rule
# leaves the others off, and a fitted -inf (the signal flags nothing) is off too.
_THRESHOLD_RANGES = {"min_document_share": (0.0, 0.0, 1.0), "min_mean_logprob": (-100.0, -100.0, 0.0),
                     "min_grounded_share": (0.0, 0.0, 1.0), "min_verify_yes": (0.0, 0.0, 1.0),
                     "min_claim_logprob": (-100.0, -100.0, 0.0), "min_asked_share": (0.0, 0.0, 1.0)}
ENGINE_SIGNALS = tuple(_THRESHOLD_RANGES)
# The candidate signals, by the name of their threshold: the engine's, and cheap alternatives from the same answer,
# fitted and reported the same way to see whether they help.
CANDIDATES = {
    "share + log-prob (before)": ("min_document_share", "min_mean_logprob"),
    "share": ("min_document_share",),
    "mean log-prob": ("min_mean_logprob",),
    "min token log-prob": ("min_token_logprob",),
    "first 4 tokens' log-prob": ("min_first_logprob",),
    "top page's share": ("min_top_page_share",),
    "grounded words": ("min_grounded_share",),
    "share + grounded": ("min_document_share", "min_grounded_share"),
    "log-prob + grounded": ("min_mean_logprob", "min_grounded_share"),
    "share + log-prob + grounded": ("min_document_share", "min_mean_logprob", "min_grounded_share"),
    # The verification turn (``benchmarks.quality.support_verify``): P(yes) that the document states the answer to the
    # question, asked before the answer on the question alone (the engine's ``min_verify_yes``) or after the answer
    # (the question and the answer as the conversation so far; not what the engine runs).
    "verify": ("min_verify_yes",),
    "share + verify": ("min_document_share", "min_verify_yes"),
    "log-prob + verify": ("min_mean_logprob", "min_verify_yes"),
    "grounded + verify": ("min_grounded_share", "min_verify_yes"),
    "share + log-prob + verify": ("min_document_share", "min_mean_logprob", "min_verify_yes"),
    "log-prob + grounded + verify": ("min_mean_logprob", "min_grounded_share", "min_verify_yes"),
    # The answer's claim tokens (its own words, not the question's restated): their mean log-prob (from the
    # recorded log-probs; the engine's ``min_claim_logprob``, so these rules can ship), how much more likely the
    # document made them (``contrast``: log p with the document minus log p without it, ``benchmarks.quality.support_trace``:
    # one extra forward per answer), and their attention share.
    "claim log-prob": ("min_claim_logprob",),
    "share + claim log-prob": ("min_document_share", "min_claim_logprob"),
    "log-prob + claim log-prob": ("min_mean_logprob", "min_claim_logprob"),
    "claim log-prob + grounded": ("min_claim_logprob", "min_grounded_share"),
    "contrast": ("min_contrast",),
    "log-prob + contrast": ("min_mean_logprob", "min_contrast"),
    "share + contrast": ("min_document_share", "min_contrast"),
    "claim tokens' share": ("min_claim_share",),
    # The question's own words the document uses anywhere (``asked_share``): a question about what the document never
    # names (another program, another system) is one it cannot answer, whatever the model wrote.
    "asked words": ("min_asked_share",),
    "share + asked words": ("min_document_share", "min_asked_share"),
    "log-prob + asked words": ("min_mean_logprob", "min_asked_share"),
    "claim log-prob + asked words": ("min_claim_logprob", "min_asked_share"),
    "share + claim log-prob + asked words": ("min_document_share", "min_claim_logprob", "min_asked_share"),
    "verify after the answer": ("min_verify_answer",),
    "log-prob + verify after the answer": ("min_mean_logprob", "min_verify_answer"),
}
# The rules the engine can ship (its own signals; a threshold left out is off); per model, the one with the best
# held-out rates is fitted on all answers and goes into ``engine.answer.support._FITTED``.
# The verification turn is not picked automatically: it costs a prefill per answer (seconds, not milliseconds) and
# is shipped for a model only by hand, where it beats that model's rule held out (so far none: support.md).
SHIPPABLE = [rule for rule, names in CANDIDATES.items()
             if set(names) <= set(ENGINE_SIGNALS) and "min_verify_yes" not in names]


def _claim_signals(record: dict) -> dict[str, float | None]:
    """The claim-token signals of one answer: from its recorded log-probs and tokens, and, where a trace
    (``benchmarks.quality.support_trace``, joined as ``trace``) was recorded, the document contrast and attention."""
    trace = record.get("trace") or {}
    tokens = record.get("tokens") or trace.get("tokens")
    logprobs = record.get("token_logprobs") or []
    out = {"min_claim_logprob": None, "min_contrast": None, "min_claim_share": None}
    if not tokens or not logprobs:
        return out
    # The engine's own pick (``claim_logprob``, which ``DocumentSession`` runs on the answer's tokens and log-probs).
    picked = claim_indices(tokens, logprobs, record["question"])
    out["min_claim_logprob"] = sum(logprobs[i] for i in picked) / len(picked)
    alone = trace.get("logprob_alone")
    if alone:
        out["min_contrast"] = sum(logprobs[i] - alone[i] for i in picked if i < len(alone)) / len(picked)
    mass = trace.get("mass")
    if mass:  # [tokens][before the pages, each page, the question, the answer]
        on_pages = sum(sum(mass[i][1:-2]) for i in picked if i < len(mass))
        total = sum(sum(mass[i]) for i in picked if i < len(mass))
        out["min_claim_share"] = on_pages / total if total > 0 else None
    return out


def signals(record: dict, pages: dict[str, str], words: frozenset[str] = frozenset()) -> dict[str, float | None]:
    """Every candidate signal of one answer, keyed by its threshold's name (None: not available); ``pages``: its
    document's {page label: text}, ``words``: its ``document_words`` (the whole prompt text, as the engine's)."""
    logprobs = record.get("token_logprobs") or []
    sources = record.get("sources") or []
    cited = [pages.get(page or "", "") for page, _ in sources]
    return {**_claim_signals(record),
            "min_document_share": record["document_share"], "min_mean_logprob": record["mean_logprob"],
            "min_grounded_share": grounded_share(record["answer"], record["question"], cited) if sources else None,
            "min_token_logprob": min(logprobs) if logprobs else None,
            "min_first_logprob": sum(logprobs[:4]) / len(logprobs[:4]) if logprobs else None,
            "min_top_page_share": sources[0][1] if sources else None,
            "min_verify_yes": record.get("yes_question"), "min_verify_answer": record.get("yes_answer"),
            "min_asked_share": asked_share(record["question"], words)[0] if words else None}


def _matrix(rows: list[dict], names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """([answers, signals] values, NaN where missing (None or not computed); [answers] True for an unsupported
    question)."""
    values = np.array([[np.nan if row["signals"].get(n) is None else row["signals"][n] for n in names]
                       for row in rows], dtype=float).reshape(len(rows), len(names))
    return values, np.array([row["kind"] == "unsupported" for row in rows])


def _flags(values: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """[answers] flagged: any present signal under its threshold (``decide``'s rule; a missing one never flags)."""
    with np.errstate(invalid="ignore"):
        return np.any(~np.isnan(values) & (values < thresholds), axis=1)


def _packed(mask: np.ndarray) -> np.ndarray:
    """[..., answers] bools -> [..., words] uint64 bit sets (answer i: bit i % 64 of word i // 64)."""
    words = max(1, -(-mask.shape[-1] // 64))
    padded = np.zeros(mask.shape[:-1] + (words * 64,), dtype=bool)
    padded[..., :mask.shape[-1]] = mask
    bits = np.packbits(padded.reshape(mask.shape[:-1] + (words, 64)), axis=-1, bitorder="little")
    return np.ascontiguousarray(bits).view(np.uint64)[..., 0]


def fit(values: np.ndarray, unsupported: np.ndarray) -> np.ndarray:
    """The thresholds that flag the most unsupported answers while flagging at most ``MAX_SUPPORTED_FLAGGED`` of the
    supported ones (ties: fewer supported flagged, then the lowest thresholds), over the answers' own values (and
    'off', -inf). Exhaustive over the grid of every combination: a few dozen answers, at most three signals; the
    answers each threshold flags are bit sets, so a grid point costs an OR and two popcounts per 64 answers (the
    nested held-out rates fit thousands of grids)."""
    candidates = [np.concatenate([[-np.inf], np.unique(column[~np.isnan(column)]) + 1e-9]) for column in values.T]
    words = max(1, -(-len(unsupported) // 64))
    flagged = np.zeros([len(c) for c in candidates] + [words], dtype=np.uint64)  # [c1, ..., ck, words]
    for j, column in enumerate(values.T):
        with np.errstate(invalid="ignore"):
            under = ~np.isnan(column)[None, :] & (column[None, :] < candidates[j][:, None])  # [cj, answers]
        shape = [1] * len(candidates) + [words]
        shape[j] = len(candidates[j])
        flagged |= _packed(under).reshape(shape)
    counts = [np.bitwise_count(flagged & _packed(kind)).sum(-1) for kind in (unsupported, ~unsupported)]
    caught = counts[0] / unsupported.sum() if unsupported.any() else np.zeros(flagged.shape[:-1])
    false = counts[1] / (~unsupported).sum() if (~unsupported).any() else np.zeros(flagged.shape[:-1])
    ok = false <= MAX_SUPPORTED_FLAGGED + 1e-12
    ok &= caught >= caught[ok].max() - 1e-12
    ok &= false <= false[ok].min() + 1e-12
    best = np.unravel_index(np.flatnonzero(ok)[0], ok.shape)  # the first in grid order: the lowest thresholds
    return np.array([candidates[j][i] for j, i in enumerate(best)])


def _rates(flagged: np.ndarray, unsupported: np.ndarray) -> tuple[float, float]:
    """(share of unsupported flagged, share of supported flagged)."""
    return float(flagged[unsupported].mean()), float(flagged[~unsupported].mean())


def held_out(values: np.ndarray, unsupported: np.ndarray) -> tuple[float, float]:
    """Leave one question out: each answer judged by thresholds fitted on all the others."""
    flagged = np.zeros(len(unsupported), dtype=bool)
    for i in range(len(unsupported)):
        rest = np.arange(len(unsupported)) != i
        flagged[i] = _flags(values[i:i + 1], fit(values[rest], unsupported[rest]))[0]
    return _rates(flagged, unsupported)


def _pick(rows: list[dict]) -> tuple:
    """The shippable rule with the best held-out rates on ``rows`` (``write_markdown``'s choice): its names."""
    best = None
    for rule in SHIPPABLE:
        u, s = held_out(*_matrix(rows, CANDIDATES[rule]))
        score = (s <= MAX_SUPPORTED_FLAGGED and u > 0, u, -s)
        if best is None or score > best[0]:
            best = (score, CANDIDATES[rule])
    return best[1]


def nested_held_out(rows: list[dict]) -> tuple[float, float]:
    """Leave one question out around the whole procedure: the rule is picked (``_pick``) and fitted on the others,
    then judges the one left out. The choice of rule is itself fitted to the answers, so the held-out rate of the
    rule picked is optimistic; this one is not."""
    flagged = np.zeros(len(rows), dtype=bool)
    for i in range(len(rows)):
        rest = rows[:i] + rows[i + 1:]
        names = _pick(rest)
        flagged[i] = _flags(_matrix(rows[i:i + 1], names)[0], fit(*_matrix(rest, names)))[0]
    return _rates(flagged, np.array([row["kind"] == "unsupported" for row in rows]))


def across_documents(rows: list[dict], names: tuple[str, ...]) -> tuple[float, float]:
    """Fitted on one document's questions, judged on the other's (and back): a manual the fit never saw."""
    flagged, kinds = [], []
    for document in dict.fromkeys(row["document"] for row in rows):
        train, test = ([row for row in rows if (row["document"] == document) == side] for side in (False, True))
        if not train:
            continue
        values, unsupported = _matrix(test, names)
        flagged.append(_flags(values, fit(*_matrix(train, names))))
        kinds.append(unsupported)
    if not flagged:
        return float("nan"), float("nan")
    return _rates(np.concatenate(flagged), np.concatenate(kinds))


def _rounded(thresholds: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``thresholds`` rounded up to the fewest decimals (3 to 6) that flag exactly the answers they flag. A fitted
    threshold sits 1e-9 over the highest answer it flags; rounded to the nearest, it could fall under that answer
    and stop flagging it (it did: -0.18059858 shipped as -0.181 flagged one invented answer fewer on the 1.5B)."""
    exact = _flags(values, thresholds)
    for decimals in (3, 4, 5, 6):
        scale = 10 ** decimals
        rounded = np.array([math.ceil(t * scale) / scale if math.isfinite(t) else t for t in thresholds])
        if np.array_equal(_flags(values, rounded), exact):
            return rounded
    return thresholds


def fitted_thresholds(rows: list[dict], names: tuple[str, ...]) -> SupportThresholds:
    """The engine's thresholds for the rule ``names`` fitted on all of ``rows`` (the others off), rounded so that
    they flag the same answers as the fit."""
    values, unsupported = _matrix(rows, names)
    fitted = dict(zip(names, (float(t) for t in _rounded(fit(values, unsupported), values))))
    return SupportThresholds(**{name: min(max(fitted[name], low), high) if math.isfinite(fitted.get(name, -math.inf))
                                else off for name, (off, low, high) in _THRESHOLD_RANGES.items()})


# Signals recorded for some answers only (a verification turn, a trace): rules using them are judged on those answers.
PARTIAL = ("min_verify", "min_contrast", "min_claim_share", "min_claim_logprob")


def _fresh(records: list[dict], model: str, layout: str) -> list[dict]:
    return [r for r in records if r["model"] == model and r["layout"] == layout and r["chat"] == "fresh"]


def _join_checks(records: list[dict], path: Path) -> None:
    """Adds the verification turn's P(yes) and cost (``benchmarks.quality.support_verify``) to the fresh glued answers."""
    if not path.is_file():
        return
    checks = {(c["model"], c["document"], c["question"]): c for c in map(json.loads, path.read_text().splitlines())}
    for r in records:
        check = checks.get((r["model"], r["document"], r["question"]))
        if check is not None and r["layout"] == "glued" and r["chat"] == "fresh":
            r.update({k: v for k, v in check.items() if k.startswith(("yes_", "check_s_"))})


def _join_traces(records: list[dict], path: Path) -> None:
    """Adds each fresh glued answer's trace (``benchmarks.quality.support_trace``) as ``trace``, for the claim signals."""
    if not path.is_file():
        return
    traces: dict[tuple, dict] = {}
    for t in map(json.loads, path.read_text().splitlines()):  # an answer's lines (one per trace mode) merged
        traces.setdefault((t["model"], t["document"], t["question"]), {}).update(t)
    for r in records:
        trace = traces.get((r["model"], r["document"], r["question"]))
        if trace is not None and r["layout"] == "glued" and r["chat"] == "fresh":
            r["trace"] = trace


def by_answer(rows: list[dict]) -> list[dict]:
    """The same answers labelled by what each one claims rather than by its question: a right answer to a question the
    pages answer is supported; a wrong one (another option, an invented default) is a claim the pages do not
    support, whichever question it answers; an answer that says the document does not say is left out (it claims
    nothing to flag). The flag judges answers, so this is the labelling its thresholds are fitted on."""
    labelled = []
    for row in rows:
        if row["kind"] == "supported":
            labelled.append({**row, "kind": "supported" if row["correct"] else "unsupported"})
        elif not row["correct"]:
            labelled.append(row)
    return labelled


def _answer_level_lines(records: list[dict], models: list[str], layouts: list[str]) -> tuple[list[str], dict]:
    """``support.md``'s per-answer table, and the rule each model ships ({model: (rule, thresholds)}): the engine's
    cheap rules judged on ``by_answer``'s labels, held out as in the per-question table, and the whole choice
    held out (``nested_held_out``)."""
    lines = ["", "## The flag, judged per answer (what the engine ships)", "",
             "The same fresh-chat answers, labelled by what each answer claims (`by_answer`): *supported*: a right "
             "answer to a question the pages answer; *unsupported*: a wrong answer, to either kind of question (an "
             "invented default, another program's option); an answer that says the document does not say claims "
             "nothing and is left out. The flag's job is the second kind: an answer whose claim the pages do not hold, "
             "not a question the pages cannot answer. Same fits, same held-out procedure.", "",
             "| model | layout | supported / unsupported answers | rule | held out: unsupported flagged | held out: "
             "supported flagged | across documents: unsupported / supported flagged | fitted on all: thresholds |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    shipped, chosen = [], {}
    for model in models:
        for layout in [layout for layout in layouts if layout == "glued"]:  # the app's layout (a few `turn` answers)
            rows = by_answer(_fresh(records, model, layout))
            if len({r["kind"] for r in rows}) < 2:
                continue
            counts = f"{sum(r['kind'] == 'supported' for r in rows)} / {sum(r['kind'] == 'unsupported' for r in rows)}"
            for rule in SHIPPABLE:
                values, unsupported = _matrix(rows, CANDIDATES[rule])
                u, s = held_out(values, unsupported)
                du, ds = across_documents(rows, CANDIDATES[rule])
                across = f"{du:.0%} / {ds:.0%}" if math.isfinite(du) else "–"
                thresholds = ", ".join(f"{n[4:]} {t:.3g}" for n, t in zip(CANDIDATES[rule], fit(values, unsupported))
                                       if math.isfinite(t)) or "none (flags nothing)"
                lines.append(f"| {model} | {layout} | {counts} | {rule} | {u:.0%} | {s:.0%} | {across} | "
                             f"{thresholds} |")
            names = _pick(rows)
            rule = next(rule for rule in SHIPPABLE if CANDIDATES[rule] == names)
            nu, ns = nested_held_out(rows)
            chosen[model] = (rule, fitted_thresholds(rows, names))
            shipped.append(f"- {model}: **{rule}**, `{chosen[model][1]}`; the whole choice held out: "
                           f"**{nu:.0%} of unsupported answers flagged, {ns:.0%} of supported ones**")
    lines += ["", "Shipped (`engine.answer.support._FITTED`): per model, the rule with the best held-out rates on "
              "these labels (within 10% supported flagged, then the most unsupported flagged), fitted on all its "
              "answers. The rates in bold hold the choice of rule out too. Target: >= 70% / <= 10%.", "", *shipped]
    return lines, chosen


def write_markdown(records: list[dict], texts: dict[str, str], stamp: dict, path: Path) -> None:
    """``support.md``'s tables from the records; ``texts``: {document key: its text as the prompt holds it}."""
    pages = {key: page_texts(text, page_markers(text)) for key, text in texts.items()}
    words = {key: document_words(text) for key, text in texts.items()}
    started = time.perf_counter()
    for r in records:
        r["signals"] = signals(r, pages[r["document"]], words[r["document"]])
    grounded_ms = 1000 * (time.perf_counter() - started) / max(len(records), 1)  # all signals; grounded dominates
    models = list(dict.fromkeys(r["model"] for r in records))
    layouts = [layout for layout in ("glued", "turn") if any(r["layout"] == layout for r in records)]
    asked = {kind: sum(q["kind"] == kind for d in load_questions() for q in d["questions"])
             for kind in ("supported", "unsupported")}
    lines = ["# The document may not say: the support flag, and a fresh chat against a later one (CPU)", "",
             f"Machine: {stamp['machine']}, load average at start {stamp['load_avg']} (2 cores shared with other "
             f"jobs); torch {stamp['torch']}, transformers {stamp['transformers']}; {stamp['date'][:10]}.", "",
             "`python -m benchmarks.quality.support_eval`: `benchmarks/data/support_eval.json`, two sections of Debian "
             "manuals (Bash Reference Manual PDF pp. 38-41, Debian FAQ PDF pp. 27-29), "
             f"{asked['supported']} questions the pages answer and {asked['unsupported']} that look alike but the "
             "pages do not (another program's option, "
             f"a number or default the pages do not give); a model run before the set grew has answered fewer (its "
             f"counts are in the tables). Greedy, sources on, at most {MAX_NEW_TOKENS} answer tokens.", "",
             "## The flag (fresh chats)", "",
             "Flagged when any of the rule's signals is under its threshold. Thresholds fitted to flag the most "
             f"unsupported answers with at most {MAX_SUPPORTED_FLAGGED:.0%} of the supported ones flagged. **Held "
             "out**: leave one question out (each answer judged by thresholds fitted on all the others); **across "
             "documents**: fitted on one manual's questions, judged on the other's. Target: >= 70% of "
             "unsupported flagged, <= 10% of supported flagged. Signals: `share` (the answer's attention on the "
             "pages), `log-prob` (its mean token log-probability), `grounded` (the share of the answer's own "
             "content words found on the pages it cites), and cheap alternatives (the lowest token log-prob, the "
             "first 4 tokens' mean log-prob, the top page's share of the page attention). Claim-token signals, over "
             "the answer's own words only (not the restated question, `engine.answer.support.claim_tokens`): "
             "`claim log-prob` (their mean log-prob), `contrast` (their log-prob with the document minus without it: "
             "one more forward per answer) and `claim tokens' share` (their attention on the pages); the last two "
             "from the traces `python -m benchmarks.quality.support_trace` records, judged on the answers traced "
             "(the count is in the rate's column).", "",
             "| model | layout | rule | held out: unsupported flagged | held out: supported flagged | "
             "across documents: unsupported / supported flagged | fitted on all: thresholds |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    shipped = []
    for model in models:
        for layout in layouts:
            rows = _fresh(records, model, layout)
            if len({r["kind"] for r in rows}) < 2:
                continue
            best = None
            for rule, names in CANDIDATES.items():
                # The verification turn and the traces were not run on every answer (time): a rule using them is
                # judged on those only.
                ruled = [r for r in rows if all(r["signals"][n] is not None for n in names if n.startswith(PARTIAL))]
                if len({r["kind"] for r in ruled}) < 2:
                    continue
                values, unsupported = _matrix(ruled, names)
                u, s = held_out(values, unsupported)
                # Within the target for supported answers first, then the most unsupported flagged, then the
                # fewest supported flagged (ties: the rule listed first, the simpler one).
                score = (s <= MAX_SUPPORTED_FLAGGED and u > 0, u, -s)
                if rule in SHIPPABLE and len(ruled) == len(rows) and (best is None or score > best[0]):
                    best = (score, rule)
                du, ds = across_documents(ruled, names)
                across = f"{du:.0%} / {ds:.0%}" if math.isfinite(du) else "–"
                thresholds = ", ".join(f"{n[4:]} {t:.3g}" for n, t in zip(names, fit(values, unsupported))
                                       if math.isfinite(t)) or "none (flags nothing)"
                lines.append(f"| {model} | {layout} | {rule} | {u:.0%} of {unsupported.sum()} | "
                             f"{s:.0%} of {(~unsupported).sum()} | {across} | {thresholds} |")
            if best is not None:
                nu, ns = nested_held_out(rows)
                shipped.append(f"- {model}, {layout}: **{best[1]}**, fitted on all {len(rows)} answers: "
                               f"`{fitted_thresholds(rows, CANDIDATES[best[1]])}`; the whole choice held out "
                               f"(rule picked and fitted on the other {len(rows) - 1}): {nu:.0%} / {ns:.0%}")
    lines += ["", "The rule with the best held-out rates among the engine's own cheap signals (within 10% supported "
              "flagged if any is, then the most unsupported flagged; the verification turn, a prefill per answer, is "
              "left out of this choice); the engine ships the per-answer table's choice below instead. "
              "Picking the rule by its held-out rates is itself a fit: the last rates hold that choice out too (for "
              "each question, the rule is picked and fitted on the others, then judges it).", "",
              *shipped]
    lines += _answer_level_lines(records, models, layouts)[0]
    lines += ["", "Signal values (mean over fresh-chat answers; right answers: a supported one matches its regex, an "
              "unsupported one says the document does not say):", "",
              "| model | layout | kind | share | mean log-prob | grounded | min token log-prob | verify P(yes) | verify P(yes) "
              "after the answer | right answers |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

    def mean(rows, name):
        values = [r["signals"][name] for r in rows if r["signals"][name] is not None]
        return f"{sum(values) / len(values):.2f}" if values else "–"

    for model in models:
        for layout in layouts:
            for kind in ("supported", "unsupported"):
                rows = [r for r in _fresh(records, model, layout) if r["kind"] == kind]
                if rows:
                    lines.append(f"| {model} | {layout} | {kind} | {mean(rows, 'min_document_share')} | "
                                 f"{mean(rows, 'min_mean_logprob')} | {mean(rows, 'min_grounded_share')} | "
                                 f"{mean(rows, 'min_token_logprob')} | {mean(rows, 'min_verify_yes')} | "
                                 f"{mean(rows, 'min_verify_answer')} | {sum(r['correct'] for r in rows)}/{len(rows)} |")
    lines += ["", "## A fresh chat against a later one", "",
              "Right answers to the questions the pages answer, each asked in a fresh chat and after one earlier turn "
              "(the document's warm-up question and its answer), paired: only questions asked both ways. `glued`: the "
              "first question inside the document's message; `turn`: every question its own user message after the "
              "document's (`PromptBuilder(question_turn=True)`).", "",
              "| model | layout | fresh chat | after turns |", "| --- | --- | --- | --- |"]
    for model in models:
        for layout in layouts:
            by_chat = {chat: {r["question"]: r["correct"] for r in records if r["model"] == model
                              and r["layout"] == layout and r["chat"] == chat and r["kind"] == "supported"}
                       for chat in ("fresh", "turns")}
            both = by_chat["fresh"].keys() & by_chat["turns"].keys()
            cells = [f"{sum(by_chat[chat][q] for q in both)}/{len(both)}" if both else "–" for chat in by_chat]
            lines.append(f"| {model} | {layout} | {cells[0]} | {cells[1]} |")
    lines += ["", "## Cost per answer", "",
              "The sources pass runs for every answer anyway (its time below); the support check adds one "
              "log-softmax over the vocabulary per answer token, a sum over the pass's attention mass, the "
              "grounded-words check (the answer's words against its cited pages' words; timed here on the records, "
              "pages split once per document) and the claim log-prob (the answer's claim tokens picked, a mean over "
              "their recorded log-probs).", "",
              "| model | answers | mean answer s | mean sources pass s | log-softmax ms per token | tokens per answer "
              "| support check ms per answer (log-softmaxes + grounded words + claim log-prob) |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for model in models:
        rows = [r for r in records if r["model"] == model]
        n = len(rows)
        per_token = sum(r["logprob_ms_per_token"] for r in rows) / n
        tokens = sum(r["answer_tokens"] for r in rows) / n
        lines.append(f"| {model} | {n} | {sum(r['answer_s'] for r in rows) / n:.1f} | "
                     f"{sum(r['sources_s'] for r in rows) / n:.3f} | {per_token:.2f} | {tokens:.1f} | "
                     f"{per_token * tokens + grounded_ms:.1f} |")
    checked = [r for r in records if "check_s_question" in r]
    if checked:
        lines += ["", "The verification turn (`DocumentSession.check_support`, `benchmarks.quality.support_verify`): a prefill "
                  "of the turn's few dozen tokens on the document's cached K/V (`verify`: the question alone, before the "
                  "answer, what `DocumentSession.ask` runs when the check is on; `after the answer`: the question and "
                  "the recorded answer re-read first, so it costs more here than it would in a chat) and one next-token distribution; no answer "
                  "regenerated.", "", "| model | checks | mean s (question, the engine's) | mean s after the answer (question and answer re-read) |",
                  "| --- | --- | --- | --- |"]
        for model in models:
            rows = [r for r in checked if r["model"] == model]
            if rows:
                after = [r["check_s_answer"] for r in rows if "check_s_answer" in r]
                lines.append(f"| {model} | {len(rows)} | {sum(r['check_s_question'] for r in rows) / len(rows):.1f} | "
                             + (f"{sum(after) / len(after):.1f} ({len(after)}) |" if after else "– |"))
    traced = [r for r in records if (r.get("trace") or {}).get("alone_s") is not None]
    if traced:
        lines += ["", "The contrast's extra forward (`benchmarks.quality.support_trace`): the question and the answer read again "
                  "with the document left out (a short prompt, no cache), timed per answer; and the replay that records "
                  "the claim tokens' attention (the question and the answer read on the document's K/V, a cost the "
                  "engine would not pay: its sources pass already holds the queries).", "",
                  "| model | answers traced | mean s, forward without the document | mean s, replay on the document |",
                  "| --- | --- | --- | --- |"]
        for model in models:
            rows = [r["trace"] for r in traced if r["model"] == model]
            if rows:
                replays = [t["replay_s"] for t in rows if "replay_s" in t]
                lines.append(f"| {model} | {len(rows)} | {sum(t['alone_s'] for t in rows) / len(rows):.1f} | "
                             + (f"{sum(replays) / len(replays):.1f} |" if replays else "– |"))
    for r in records:
        del r["signals"]
    previous = path.read_text() if path.is_file() else ""
    reading = previous[previous.index(READING):] if READING in previous else ""
    path.write_text("\n".join(lines) + "\n" + ("\n" + reading if reading else ""))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality.support_eval")
    p.add_argument("--models", default="smollm2,qwen2.5-coder-1.5b")
    p.add_argument("--layouts", default="turn,glued")
    p.add_argument("--chats", default="fresh,turns")
    p.add_argument("--kinds", default="supported,unsupported", help="which kinds of question are asked at all")
    p.add_argument("--turns-kinds", default="supported,unsupported",
                   help="which kinds of question are also asked after turns (the fresh-vs-later comparison)")
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
    jsonl = data_file(out, "support.jsonl")
    records = [json.loads(line) for line in jsonl.read_text().splitlines()] if jsonl.is_file() else []
    done = {_key(r) for r in records}
    _join_checks(records, data_file(out, "support-verify.jsonl"))
    _join_traces(records, data_file(out, "support-traces.jsonl"))
    stamp = run_stamp("cpu")

    def emit(record: dict) -> None:
        records.append(record)
        append_jsonl(jsonl, {k: v for k, v in record.items() if k != "trace"})

    texts = {d["key"]: document_text(d, Path(args.cache)) for d in load_questions()}
    if args.tables_only:
        write_markdown(records, texts, stamp, out / "support.md")
        return 0
    for key in args.models.split(","):
        evaluate(key, args.weights, args.layouts.split(","), args.chats.split(","), documents, texts, done, emit,
                 tuple(args.turns_kinds.split(",")), tuple(args.kinds.split(",")))
        write_markdown(records, texts, stamp, out / "support.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
