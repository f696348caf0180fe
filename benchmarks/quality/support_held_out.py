"""The support flag held out by manual: is "the document may not say" right on a manual it was not fitted on?

    python -m benchmarks.quality.support_held_out [--model qwen2.5-coder-1.5b] [--tables-only]

Five manuals: the two of ``benchmarks/data/support_eval.json`` (their answers are ``docs/benchmarks/data/support.jsonl``'s
fresh glued chats, the ones today's thresholds were fitted on) and three nobody here wrote or fitted on
(``docs/benchmarks/data/support_held_out.json``: the R FAQ and R Installation and Administration from Debian's
r-doc-pdf, and gnuplot's terminals, read as the app reads an upload), whose look-alike questions are answered on a neighbouring page by a
string that belongs to another entity. Their answers are asked as ``benchmarks.quality.support_eval`` asks (a fresh chat, the
glued layout, greedy, sources on) and cached in ``docs/benchmarks/data/support-held-out.jsonl`` with the sources
pass's attention peaks, so fitting and scoring reruns cost no model time.

Every rate is leave-one-manual-out: the thresholds that judge a manual's answers are fitted on the other manuals'
answers only. ``docs/benchmarks/support-held-out.md``: flagged unsupported / supported per held-out manual and
overall, for today's rule and for the rules with the entity signal (``engine.answer.support_entity``).
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

from engine.answer.support import document_words, page_texts, thresholds_for
from engine.answer.support_binding import binding_share
from engine.answer.support_entity import entity_share, peak_entity_share
from engine.types import page_markers

from .model_eval import document_text
from ..records import append_jsonl, run_stamp

logger = logging.getLogger(__name__)

DATA = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
QUESTIONS = DATA / "data" / "support_held_out.json"
ANSWERS = DATA / "data" / "support-held-out.jsonl"  # the new manuals' answers (the model-time cache)
FITTED_ANSWERS = DATA / "data" / "support.jsonl"  # support_eval's answers: the two manuals today's thresholds were fitted on
REPORT = DATA / "support-held-out.md"
CLAIMS = DATA / "data" / "support-claim.jsonl"  # the claim check's P(yes) per cached answer (``support_claim``)
COUNTERFACTUALS = DATA / "data" / "support-counterfactual.jsonl"  # ``support_counterfactual``'s gain per answer
REVERSES = DATA / "data" / "support-reverse.jsonl"  # ``support_reverse``'s margin and own-token gain per answer
REASKS = DATA / "data" / "support-reask.jsonl"  # ``support_reask``'s re-answer and overlap per answer
SORT_REASKS = DATA / "data" / "support-sort-reask.jsonl"  # the same with ``support_sort``'s rival of the same sort
MODEL = "qwen2.5-coder-1.5b"  # the CPU default model (engine/models/pypi.py)
READING = "## Reading"  # the hand-written part of the report starts at this heading, kept when the tables are rewritten
PEAKS = 8  # the document positions with the most answer attention kept per answer
_CACHE = Path.home() / ".cache" / "headinfer-studio" / "eval-docs"  # the manuals' Debian packages


def load_questions(path: Path = QUESTIONS) -> list[dict]:
    return json.loads(path.read_text())["documents"]


@contextlib.contextmanager
def capturing_mass():
    """The sources pass's attention mass ([L] over cache positions), as ``AnswerSources`` hands it to
    ``document_share``; the last answer's stays in the list."""
    import engine.answer.sources as sources_module

    captured: list = []
    original = sources_module.document_share

    def capture(mass, document_range, pages):
        captured[:] = [mass.clone()]
        return original(mass, document_range, pages)

    sources_module.document_share = capture
    try:
        yield captured
    finally:
        sources_module.document_share = original


def attention_peaks(mass, starts, first: int, top: int = PEAKS) -> list[list[float]]:
    """[[character offset in the document text, share of the mass after the sink], ...] of the ``top`` document
    tokens (from position ``first``, the first page) the answer attended to most; ``starts``: each document
    token's character offset (``DocumentTokens.starts``)."""
    stop = min(len(starts), mass.shape[0])
    total = float(mass[4:].sum())
    if total <= 0 or first >= stop:
        return []
    values = mass[first:stop]
    order = values.argsort(descending=True)[:top].tolist()
    return [[int(starts[first + i]), round(float(values[i]) / total, 5)] for i in order if starts[first + i] >= 0]


def generate(model: str, documents: list[dict], texts: dict[str, str], path: Path = ANSWERS) -> None:
    """Asks the documents' questions not yet in ``path`` and appends their records (with the attention peaks)."""
    from .support_eval import _key, evaluate

    records = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    done = {_key(r) for r in records}
    with capturing_mass() as mass:
        def observe(session, record):
            first = session._pages[0][0] if session._pages else 0
            record["peaks"] = attention_peaks(mass[0], session._starts, first) if mass else []
            record["at"] = round(time.time(), 1)

        evaluate(model, "auto", ["glued"], ["fresh"], documents, texts, done, lambda r: append_jsonl(path, r),
                 observe=observe)


# The rules compared, by their thresholds' names (``benchmarks.quality.support_eval``'s signals plus the entity share).
BEFORE = ("min_document_share", "min_mean_logprob")  # today's rule (``_FITTED``'s for the CPU default model)
RULES = {
    "share + log-prob (today's rule, refitted)": BEFORE,
    "share": ("min_document_share",),
    "entity": ("min_entity_share",),
    "share + entity": ("min_document_share", "min_entity_share"),
    "share + log-prob + entity": ("min_document_share", "min_mean_logprob", "min_entity_share"),
    "log-prob + entity": ("min_mean_logprob", "min_entity_share"),
    "share + grounded + entity": ("min_document_share", "min_grounded_share", "min_entity_share"),
    "share + asked words + entity": ("min_document_share", "min_asked_share", "min_entity_share"),
    # The binding signal (``support_binding``): the sentence holding the answer's words and the headings above it.
    "binding": ("min_binding_share",),
    "share + binding": ("min_document_share", "min_binding_share"),
    "share + log-prob + binding": ("min_document_share", "min_mean_logprob", "min_binding_share"),
    "share + binding, the sentence alone": ("min_document_share", "min_binding_sentence"),
}


def fitted_records(model: str = MODEL, path: Path = FITTED_ANSWERS) -> list[dict]:
    """support_eval's fresh glued answers of ``model``: the two manuals its shipped thresholds were fitted on."""
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return [r for r in records if r["model"] == model and r["layout"] == "glued" and r["chat"] == "fresh"]


def cited_spans(text: str, labels: list[str]) -> list[tuple[int, int]]:
    """(start, end) in ``text`` of each page whose label is in ``labels`` (the pages an answer cites)."""
    markers = page_markers(text)
    return [(page.end, markers[i + 1].start if i + 1 < len(markers) else len(text))
            for i, page in enumerate(markers) if page.label in set(labels)]


def claim_checks(path: Path = CLAIMS, model: str = MODEL) -> dict[tuple[str, str], dict]:
    """{(manual, question): the claim check's line} of ``model`` (``support_claim``'s cache; empty without it)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return {(r["document"], r["question"]): r for r in lines if r["model"] == model}


def labelled_rows(records: list[dict], texts: dict[str, str], claims: dict | None = None,
                  counterfactuals: dict | None = None, reverses: dict | None = None,
                  reasks: dict | None = None, sort_reasks: dict | None = None) -> list[dict]:
    """``by_answer``'s rows (a right answer supported, a wrong one unsupported, "the document does not say" left
    out), each with every signal: support_eval's, ``min_entity_share`` and ``min_binding_share`` (on the pages the
    answer cites) and the claim check's P(yes) where ``claims`` holds it."""
    from .support_eval import by_answer, signals

    rows = []
    for record in by_answer(records):
        text = texts[record["document"]]
        pages = page_texts(text, page_markers(text))
        labels = [page or "" for page, _ in record.get("sources") or []]
        cited, spans = [pages.get(label, "") for label in labels], cited_spans(text, labels)
        found = signals(record, pages, document_words(text))
        found["min_entity_share"] = entity_share(record["question"], record["answer"], cited, text) if cited else None
        for name, headings in (("min_binding_share", True), ("min_binding_sentence", False)):
            found[name] = binding_share(record["question"], record["answer"], text, spans, headings) if spans else None
        peaks = record.get("peaks")  # recorded for the new manuals' answers only
        found["min_peak_entity"] = peak_entity_share(record["question"], text, peaks) if peaks else None
        claim = (claims or {}).get((record["document"], record["question"]), {})
        found["min_claim_after"], found["min_claim_quoted"] = claim.get("yes_after"), claim.get("yes_quoted")
        swap = (counterfactuals or {}).get((record["document"], record["question"]))
        found["min_counterfactual"] = swap.get("gain") if swap else None
        reverse = (reverses or {}).get((record["document"], record["question"]))
        found["min_own_gain"] = reverse.get("own_gain") if reverse else None
        found["min_reverse_margin"] = reverse.get("reverse_margin") if reverse else None
        reask = (reasks or {}).get((record["document"], record["question"]))
        overlap = reask.get("reask_overlap") if reask else None
        found["min_reask_novelty"] = None if overlap is None else 1.0 - overlap
        sort_reask = (sort_reasks or {}).get((record["document"], record["question"]))
        overlap = sort_reask.get("reask_overlap") if sort_reask else None
        found["min_sort_reask_novelty"] = None if overlap is None else 1.0 - overlap
        rows.append({**record, "signals": found, "claim_s": [claim.get("check_s_after"), claim.get("check_s_quoted")],
                     "counterfactual": swap, "reverse": reverse, "reask": reask, "sort_reask": sort_reask})
    return rows


def counterfactual_scores(path: Path = COUNTERFACTUALS, model: str = MODEL) -> dict[tuple[str, str], dict]:
    """{(manual, question): the counterfactual scoring's line} of ``model`` (``support_counterfactual``'s cache)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return {(r["document"], r["question"]): r for r in lines if r["model"] == model}


def fit_rows(rows: list[dict], names: tuple[str, ...]) -> np.ndarray:
    """``support_eval.fit``'s thresholds for the rule ``names`` on ``rows`` (the most unsupported flagged with at
    most 10% of the supported ones)."""
    from .support_eval import _matrix, fit

    if len({row["kind"] for row in rows}) < 2:  # nothing to separate: the rule flags nothing
        return np.full(len(names), -np.inf)
    return fit(*_matrix(rows, names))


def judged(rows: list[dict], names: tuple[str, ...], thresholds) -> np.ndarray:
    """[rows] flagged by ``thresholds`` (one per name; ``decide``'s rule: any present signal under its own)."""
    from .support_eval import _flags, _matrix

    return _flags(_matrix(rows, names)[0], np.asarray(thresholds, dtype=float))


def manuals(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(row["document"] for row in rows))


def leave_one_manual_out(rows: list[dict], names: tuple[str, ...], fitter=fit_rows) -> dict[str, np.ndarray]:
    """{manual: [its rows] flagged by thresholds ``fitter`` fitted on the other manuals' rows only}."""
    out = {}
    for manual in manuals(rows):
        train = [row for row in rows if row["document"] != manual]
        test = [row for row in rows if row["document"] == manual]
        out[manual] = judged(test, names, fitter(train, names))
    return out


def pick_rule(rows: list[dict], rules: dict[str, tuple[str, ...]], fitter=fit_rows) -> str:
    """The rule with the best leave-one-manual-out rates on ``rows`` (within 10% supported flagged first, then
    the most unsupported flagged, then the fewest supported flagged; ties: the rule listed first)."""
    best = None
    for rule, names in rules.items():
        u, s = rates(rows, leave_one_manual_out(rows, names, fitter))
        score = (s <= 0.10 + 1e-12, u, -s)
        if best is None or score > best[0]:
            best = (score, rule)
    return best[1]


def chosen_held_out(rows: list[dict], rules: dict[str, tuple[str, ...]],
                    fitter=fit_rows) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The whole choice held out: per manual, the rule is picked (``pick_rule``, itself leave-one-manual-out
    among the other manuals) and fitted on the other manuals, then judges the manual. ({manual: flags},
    {manual: the rule picked without it})."""
    flags, picked = {}, {}
    for manual in manuals(rows):
        train = [row for row in rows if row["document"] != manual]
        test = [row for row in rows if row["document"] == manual]
        picked[manual] = pick_rule(train, rules, fitter)
        names = rules[picked[manual]]
        flags[manual] = judged(test, names, fitter(train, names))
    return flags, picked


def rates(rows: list[dict], flags: dict[str, np.ndarray], manual: str | None = None) -> tuple[float, float]:
    """(share of unsupported rows flagged, share of supported ones) of ``manual`` (None: all manuals)."""
    flagged, unsupported = [], []
    for name in manuals(rows):
        if manual is None or name == manual:
            flagged.append(flags[name])
            unsupported.append(np.array([row["kind"] == "unsupported" for row in rows if row["document"] == name]))
    flagged, unsupported = np.concatenate(flagged), np.concatenate(unsupported)
    u = float(flagged[unsupported].mean()) if unsupported.any() else math.nan
    s = float(flagged[~unsupported].mean()) if (~unsupported).any() else math.nan
    return u, s


def shipped_flags(rows: list[dict], model: str = MODEL) -> dict[str, np.ndarray]:
    """Today's shipped thresholds (``thresholds_for``: fitted on the first two manuals), as they are."""
    shipped = thresholds_for(model)
    values = [getattr(shipped, name) for name in BEFORE]
    return {manual: judged([row for row in rows if row["document"] == manual], BEFORE, values)
            for manual in manuals(rows)}


def _cell(rows: list[dict], flags: dict[str, np.ndarray], manual: str | None) -> str:
    u, s = rates(rows, flags, manual)
    return f"{u:.0%} / {s:.0%}".replace("nan%", "–")


def _target(rows: list[dict], flags: dict[str, np.ndarray]) -> str:
    u, s = rates(rows, flags)
    return "**met**" if u >= 0.70 - 1e-12 and s <= 0.10 + 1e-12 else "not met"


def report_lines(rows: list[dict], new: list[dict], stamp: dict, model: str = MODEL) -> list[str]:
    """support-held-out.md: the table of flagged unsupported / supported per held-out manual and overall."""
    names = manuals(rows)
    counts = " | ".join(f"{sum(r['kind'] == 'supported' for r in rows if r['document'] == m)} / "
                        f"{sum(r['kind'] == 'unsupported' for r in rows if r['document'] == m)}" for m in names)
    header = "| rule | " + " | ".join(names) + " | overall | target (>= 70% / <= 10%) |"
    lines = ["# The document may not say, held out by manual (CPU default model)", "",
             f"Machine: {stamp['machine']}, load average at start {stamp['load_avg']} (2 cores shared with other "
             f"jobs); torch {stamp['torch']}, transformers {stamp['transformers']}; {stamp['date'][:10]}. Written by "
             "`python -m benchmarks.quality.support_held_out` (rerun with `--tables-only`: the answers are cached).",
             ""]
    lines += _reask_lines(rows)
    lines += _reverse_lines(rows)
    lines += [f"Model: {model} (the CPU default, GGUF Q4_K_M), fresh chats, the app's glued layout, greedy, sources "
             "on, at most 48 answer tokens. Five manuals: `bash-redirections` and `faq-packages` "
             "(`benchmarks/data/support_eval.json`, the two today's thresholds were fitted on; answers from "
             "`docs/benchmarks/data/support.jsonl`), `r-faq-install` and `r-admin-windows-mac` "
             "(`docs/benchmarks/data/support_held_out.json`: the R FAQ pp. 4-7 and R Installation and Administration "
             "pp. 17-20 from Debian's r-doc-pdf, read as the app reads an upload; every look-alike question there is "
             "answered on a neighbouring page or paragraph by another entity's string), and `gnuplot-terminals` "
             "(the gnuplot 5.4 manual pp. 272-276 from Debian's gnuplot-doc, its questions added after every rule "
             "here was chosen; each look-alike copies a neighbouring terminal's default).", "",
             "Labels are the answers' own (`support_eval.by_answer`): a right answer to a question the pages answer "
             "is supported; a wrong answer to either kind is unsupported; an answer that says the document does not "
             "say is left out (nothing to flag). Answers per manual (supported / unsupported): " + counts + ".", "",
             "Each cell: unsupported answers flagged / supported answers flagged. **Every rate is leave-one-manual-"
             "out**: the thresholds that judge a manual's answers are fitted (the most unsupported flagged with at "
             "most 10% of the supported flagged) on the other manuals' answers only. `today's shipped "
             "thresholds` are `engine.answer.support._FITTED`'s as they are: fitted on the first two manuals, so "
             "their cells for those two are not held out. `the whole choice held out`: for each manual, the rule "
             "too is picked (by its leave-one-manual-out rates among the other manuals) without it.", "",
             header, "| --- | " + " | ".join("---" for _ in names) + " | --- | --- |"]

    def row(label: str, flags: dict[str, np.ndarray]) -> str:
        return (f"| {label} | " + " | ".join(_cell(rows, flags, m) for m in names)
                + f" | {_cell(rows, flags, None)} | {_target(rows, flags)} |")

    lines.append(row("today's shipped thresholds (share + log-prob)", shipped_flags(rows, model)))
    for rule, rule_names in RULES.items():
        lines.append(row(rule, leave_one_manual_out(rows, rule_names)))
    flags, picked = chosen_held_out(rows, RULES)
    lines.append(row("the whole choice held out", flags))
    lines += ["", "Rules picked without each manual: " + "; ".join(f"{m}: {r}" for m, r in picked.items()) + ".", ""]
    lines += _peak_lines(rows) + _claim_lines(rows) + _counterfactual_lines(rows) + _signal_lines(rows)
    lines += _cost_lines(new)
    return lines


# The attention-peak variant: the answers' attention peaks were recorded for the new manuals only.
PEAK_RULES = {
    "entity": ("min_entity_share",),
    "share + entity": ("min_document_share", "min_entity_share"),
    "peak entity": ("min_peak_entity",),
    "share + peak entity": ("min_document_share", "min_peak_entity"),
    "share + entity + peak entity": ("min_document_share", "min_entity_share", "min_peak_entity"),
}


def _peak_lines(rows: list[dict]) -> list[str]:
    """The entity signal read off the attention peaks (``peak_entity_share``) against the answer-word one, on the
    manuals whose answers recorded peaks: fitted on the one, judged on the other."""
    peaked = [row for row in rows if row["signals"].get("min_peak_entity") is not None]
    names = manuals(peaked)
    if len(names) < 2:
        return []
    lines = ["The entity signal read off the answer's attention instead of its words (`peak entity`: how much of "
             f"the question is said within 200 characters of the {PEAKS} document tokens the answer attended to "
             "most, by their attention), on the manuals whose answers recorded the peaks (the new ones): fitted on "
             "the other, judged on each.", "",
             "| rule | " + " | ".join(names) + " | overall |", "| --- | " + " | ".join("---" for _ in names) + " | --- |"]
    for rule, rule_names in PEAK_RULES.items():
        flags = leave_one_manual_out(peaked, rule_names)
        lines.append(f"| {rule} | " + " | ".join(_cell(peaked, flags, m) for m in names)
                     + f" | {_cell(peaked, flags, None)} |")
    return lines + [""]


# The claim check (``support_claim``): a model pass per answer, cached for the manuals it has reached.
CLAIM_RULES = {
    "share + log-prob": BEFORE,
    "claim check, after the answer": ("min_claim_after",),
    "claim check, quoted in a fresh chat": ("min_claim_quoted",),
    "share + binding": ("min_document_share", "min_binding_share"),
    "share + claim check, after": ("min_document_share", "min_claim_after"),
    "share + binding + claim check, after": ("min_document_share", "min_binding_share", "min_claim_after"),
}


def _claim_lines(rows: list[dict]) -> list[str]:
    """The claim check's rules, leave-one-manual-out on the answers it has checked (``support_claim``)."""
    checked = [row for row in rows if row["signals"].get("min_claim_after") is not None]
    names = manuals(checked)
    if len(names) < 2:
        return []
    lines = ["The claim check (`engine.answer.support_claim`, `python -m benchmarks.quality.support_claim`): after "
             "the answer, one yes/no turn on the document's cached K/V (does the document give that answer for "
             "exactly what was asked, not for another program, platform, version or person nearby?), P(yes) off "
             "the next token; `quoted`: the same with the answer quoted, in a fresh chat. On the answers it has "
             f"checked ({len(checked)}), leave-one-manual-out among their manuals:", "",
             "| rule | " + " | ".join(names) + " | overall |", "| --- | " + " | ".join("---" for _ in names) + " | --- |"]
    for rule, rule_names in CLAIM_RULES.items():
        flags = leave_one_manual_out(checked, rule_names)
        lines.append(f"| {rule} | " + " | ".join(_cell(checked, flags, m) for m in names)
                     + f" | {_cell(checked, flags, None)} |")
    seconds = [[row["claim_s"][i] for row in checked if row["claim_s"][i] is not None] for i in (0, 1)]
    if all(seconds):
        lines += ["", f"Its cost here (a prefill of the turn, the recorded question and answer re-read first for "
                  f"`after`, on the 2 busy cores): {sum(seconds[0]) / len(seconds[0]):.0f} s an answer after, "
                  f"{sum(seconds[1]) / len(seconds[1]):.0f} s quoted."]
    return lines + [""]


# The counterfactual question (``support_counterfactual``): two teacher-forced scorings per answer, cached for the
# answers it has reached. The rule was fixed before any score was read; the rules here were listed then too.
COUNTERFACTUAL_RULES = {
    "share + log-prob": BEFORE,
    "share + binding": ("min_document_share", "min_binding_share"),
    "counterfactual": ("min_counterfactual",),
    "share + counterfactual": ("min_document_share", "min_counterfactual"),
    "share + binding + counterfactual": ("min_document_share", "min_binding_share", "min_counterfactual"),
}



def _scored(rows: list[dict], key: str) -> tuple[list[dict], list[str], str]:
    """The rows a model-pass signal (``key``) has scored, their manuals, and "manual n of m" per manual."""
    scored = [row for row in rows if row.get(key) is not None]
    counts = ", ".join(f"{m} {sum(r['document'] == m for r in scored)} of {sum(r['document'] == m for r in rows)}"
                       for m in manuals(rows))
    return scored, manuals(scored), counts


def _held_out_table(scored: list[dict], names: list[str], rules: dict[str, tuple[str, ...]]) -> list[str]:
    """A table of ``rules`` scored leave-one-manual-out per manual and overall, then the whole choice held out among
    them and ``RULES`` (picked without the manual judged), and which rule each fold picked."""
    lines = ["| rule | " + " | ".join(names) + " | overall | target (>= 70% / <= 10%) |",
             "| --- | " + " | ".join("---" for _ in names) + " | --- | --- |"]

    def line(label: str, flags: dict[str, np.ndarray]) -> str:
        return (f"| {label} | " + " | ".join(_cell(scored, flags, m) for m in names)
                + f" | {_cell(scored, flags, None)} | {_target(scored, flags)} |")

    for rule, rule_names in rules.items():
        lines.append(line(rule, leave_one_manual_out(scored, rule_names)))
    flags, picked = chosen_held_out(scored, {**RULES, **rules})
    lines.append(line("the whole choice held out", flags))
    return lines + ["", "Rules picked without each manual: " + "; ".join(f"{m}: {r}" for m, r in picked.items()) + "."]

def _counterfactual_lines(rows: list[dict]) -> list[str]:
    """The counterfactual rules and the whole choice held out (among ``RULES`` and these), leave-one-manual-out on
    the answers it has scored (``support_counterfactual``; an answer whose question names no entity is scored
    with no signal: it counts, and the signal never flags it)."""
    scored, names, counts = _scored(rows, "counterfactual")
    if len(names) < 2:
        return []
    swapped = sum(row["signals"]["min_counterfactual"] is not None for row in scored)
    lines = ["The counterfactual question (`engine.answer.support_counterfactual`, `python -m "
             "benchmarks.quality.support_counterfactual`): the recorded answer teacher-forced on the document's "
             "cached K/V (`engine.answer.teacher_forced.continuation_logprobs`) under the question asked and under "
             "the question with its names and versions swapped for the competing entity nearest the answer's words "
             "on its cited pages (or dropped); the signal is mean log P(answer | asked) - mean log P(answer | "
             f"swapped), low flags. Answers scored (of those labelled): {counts}; {swapped} of them have a question "
             "with an entity to swap (the others count, and this signal never flags them). Leave-one-manual-out "
             "among their manuals; `the whole choice held out` picks among every rule of the first table and "
             "these, without the manual judged:", ""]
    lines += _held_out_table(scored, names, COUNTERFACTUAL_RULES)
    timed = [row["counterfactual"] for row in scored if row["counterfactual"].get("score_s")]
    seconds = [line["score_s"] for line in timed]
    if seconds:
        lines += ["", f"Its cost here (two teacher-forced forwards of the question turn and the answer, "
                  f"{sum(line['answer_tokens'] for line in timed) / len(timed):.0f} answer tokens on average, on the document's cached "
                  f"K/V, on the 2 busy cores): {sum(seconds) / len(seconds):.1f} s an answer (median "
                  f"{sorted(seconds)[len(seconds) // 2]:.1f} s), {len(seconds)} answers."]
    return lines + [""]


# The reverse question (``support_reverse``) and the own-token gain (``support_own_gain``): a model pass per answer,
# cached in ``REVERSES``. Listed with the signals' rules before any score was read: 6 new rules (2 earlier beside).
REVERSE_RULES = {
    "share + log-prob": BEFORE,
    "share + binding": ("min_document_share", "min_binding_share"),
    "reverse margin": ("min_reverse_margin",),
    "share + reverse margin": ("min_document_share", "min_reverse_margin"),
    "own-token gain": ("min_own_gain",),
    "share + own-token gain": ("min_document_share", "min_own_gain"),
    "share + binding + reverse margin": ("min_document_share", "min_binding_share", "min_reverse_margin"),
    "share + reverse margin + own-token gain": ("min_document_share", "min_reverse_margin", "min_own_gain"),
}


# The rival's question re-asked (``support_reask``): a generated re-answer per answer, cached in ``REASKS``. Listed
# with the signal's rule before any score was read: 4 new rules (2 earlier beside). ``min_reask_novelty`` is
# 1 - ``reask_overlap`` (the fit's rules flag a signal under its threshold; a high overlap flags).
REASK_RULES = {
    "share + log-prob": BEFORE,
    "share + binding": ("min_document_share", "min_binding_share"),
    "reask": ("min_reask_novelty",),
    "share + reask": ("min_document_share", "min_reask_novelty"),
    "binding + reask": ("min_binding_share", "min_reask_novelty"),
    "share + binding + reask": ("min_document_share", "min_binding_share", "min_reask_novelty"),
}


# The re-ask with the rival of the same sort (``support_sort``), cached in ``SORT_REASKS``. Listed with the rule
# before any score was read: 4 new rules (3 earlier beside).
SORT_REASK_RULES = {
    "share + log-prob": BEFORE,
    "share + binding": ("min_document_share", "min_binding_share"),
    "reask (nearest rival)": ("min_reask_novelty",),
    "sort-reask": ("min_sort_reask_novelty",),
    "share + sort-reask": ("min_document_share", "min_sort_reask_novelty"),
    "binding + sort-reask": ("min_binding_share", "min_sort_reask_novelty"),
    "share + binding + sort-reask": ("min_document_share", "min_binding_share", "min_sort_reask_novelty"),
}


def _reask_lines(rows: list[dict]) -> list[str]:
    """The dated section at the top: the re-asked rival question's rules (``REASK_RULES``) and the whole choice held
    out among them and ``RULES``, leave-one-manual-out on the answers scored; its coverage, means and cost."""
    scored, names, counts = _scored(rows, "reask")
    if len(names) < 2:
        return []
    covered = ", ".join(f"{m} {sum(r['signals']['min_reask_novelty'] is not None for r in scored if r['document'] == m)}"
                        for m in names)
    lines = ["## 2026-12-02: the rival's question re-asked (issue 51 item 7)", "",
             "`python -m benchmarks.quality.support_counterfactual --reask`, the signal fixed and its rules listed "
             "before any score was read (the first point under Reading). `reask` (`engine.answer.support_reask`): "
             "`counterfactual_question` (the question's entity swapped for the rival nearest the answer's words on "
             "its cited page) answered greedily in a fresh conversation on the document's cached K/V, at most 48 "
             "tokens; the signal is the rarity-weighted share of the answer's own key words (in neither question) "
             "that the re-answer says again, high flags (fitted as 1 - overlap). Answers scored (of those "
             f"labelled): {counts}; with a re-asked question: {covered} (the others count, and this signal never "
             "flags them). Every cell leave-one-manual-out; `the whole choice held out` picks among these rules and "
             "the first table's, without the manual judged.", ""]
    lines += _held_out_table(scored, names, REASK_RULES)
    lines += ["", "Mean overlap per manual and label (answers with the signal; high: the same answer for the rival):",
              "", "| manual | label | answers re-asked | mean overlap | overlap >= 0.5 |", "| --- | --- | --- | --- | --- |"]
    for manual in names:
        for kind in ("supported", "unsupported"):
            values = [1.0 - r["signals"]["min_reask_novelty"] for r in scored
                      if r["document"] == manual and r["kind"] == kind and r["signals"]["min_reask_novelty"] is not None]
            mean = f"{sum(values) / len(values):.2f}" if values else "–"
            lines.append(f"| {manual} | {kind} | {len(values)} | {mean} | {sum(v >= 0.5 for v in values)} |")
    timed = [r["reask"] for r in scored if r["reask"].get("reask_s") is not None]
    if timed:
        seconds = sorted(line["reask_s"] for line in timed)
        tokens = sum(line["reanswer_tokens"] for line in timed) / len(timed)
        lines += ["", f"Cost here (one greedy answer of the re-asked question on the cached K/V, {tokens:.0f} tokens on "
                  f"average, 2 shared cores): {sum(seconds) / len(seconds):.1f} s an answer (median "
                  f"{seconds[len(seconds) // 2]:.1f} s), {len(seconds)} answers."]
    return lines + [""]


def reask_scores(path: Path = REASKS, model: str = MODEL) -> dict[tuple[str, str], dict]:
    """{(manual, question): the re-ask's line} of ``model`` (``support_counterfactual --reask``'s cache)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return {(r["document"], r["question"]): r for r in lines if r["model"] == model}


def _reverse_lines(rows: list[dict]) -> list[str]:
    """The dated section at the top: the reverse question's and the own-token gain's rules (``REVERSE_RULES``) and
    the whole choice held out among them and ``RULES``, leave-one-manual-out on the answers scored; then how many
    answers each signal covers, their means per label, their cost and the scoring's agreement with the decode."""
    scored, names, counts = _scored(rows, "reverse")
    if len(names) < 2:
        return []
    covered = {name: ", ".join(f"{m} {sum(r['signals'][name] is not None for r in scored if r['document'] == m)}"
                               for m in names) for name in ("min_reverse_margin", "min_own_gain")}
    lines = ["## 2026-12-02: the reverse question and the own-token gain (issue 51 item 7, ideas (a), (b), (d))", "",
             "`python -m benchmarks.quality.support_counterfactual --reverse`, both signals fixed and their rules "
             "listed before any score was read (the first point under Reading). `reverse margin` "
             "(`engine.answer.support_reverse`): the question's entity word blanked out of the question and the "
             "answer's echo of it; on the document's cached K/V, log P(the word asked fills the blank) - the best "
             "of at most 3 rivals of its kind from the anchor's page, low flags. `own-token gain` "
             "(`engine.answer.support_own_gain`): the counterfactual gain on the answer's own tokens only (not the "
             f"question's words it echoes). Answers scored (of those labelled): {counts}; with a reverse question: "
             f"{covered['min_reverse_margin']}; with an own-token gain: {covered['min_own_gain']} (a question that "
             "names no entity the document uses has neither: it counts, and these signals never flag it). Every "
             "cell leave-one-manual-out (thresholds fitted on the other manuals); `the whole choice held out` picks "
             "among these rules and the first table's, without the manual judged.", ""]
    lines += _held_out_table(scored, names, REVERSE_RULES)
    lines += ["", "Mean values per manual and label (answers with the signal):", "",
              "| manual | label | reverse margin | own-token gain | whole-answer gain (recomputed) |",
              "| --- | --- | --- | --- | --- |"]
    for manual in names:
        for kind in ("supported", "unsupported"):
            picked_rows = [r for r in scored if r["document"] == manual and r["kind"] == kind]
            cells = []
            for values in ([r["signals"]["min_reverse_margin"] for r in picked_rows],
                           [r["signals"]["min_own_gain"] for r in picked_rows],
                           [_whole_gain(r["reverse"]) for r in picked_rows]):
                values = [v for v in values if v is not None]
                cells.append(f"{sum(values) / len(values):.2f} ({len(values)})" if values else "–")
            lines.append(f"| {manual} | {kind} | " + " | ".join(cells) + " |")
    forced = [r["reverse"] for r in scored if r["reverse"].get("counterfactual_s")]
    clozes = [r["reverse"] for r in scored if r["reverse"].get("reverse_s")]
    checked = [r["reverse"]["max_abs_vs_decode"] for r in scored if r["reverse"].get("max_abs_vs_decode") is not None]
    lines.append("")
    if forced and clozes:
        lines.append(f"Cost here (2 shared cores, other engineers' jobs beside): the two teacher-forced scorings of "
                     f"the answer {sum(r['counterfactual_s'] for r in forced) / len(forced):.0f} s an answer "
                     f"({len(forced)}), the reverse question (one forward of its turn, then each candidate's few "
                     f"tokens) {sum(r['reverse_s'] for r in clozes) / len(clozes):.0f} s ({len(clozes)}).")
    if checked:
        lines.append(f"The teacher-forced log-probs under the question asked equal the recorded decode's: largest "
                     f"difference {max(checked):.5f} over {len(checked)} answers whose tokens re-encode alike.")
    return lines + [""]


def _whole_gain(line: dict) -> float | None:
    """``support_counterfactual``'s gain (every answer token) off the per-token scorings kept in a reverse line."""
    asked, swapped = line.get("asked_logprobs"), line.get("swapped_logprobs")
    return sum(asked) / len(asked) - sum(swapped) / len(swapped) if asked and swapped else None


def reverse_scores(path: Path = REVERSES, model: str = MODEL) -> dict[tuple[str, str], dict]:
    """{(manual, question): the reverse scoring's line} of ``model`` (``support_counterfactual --reverse``'s cache)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return {(r["document"], r["question"]): r for r in lines if r["model"] == model}


SIGNAL_COLUMNS = {"share": "min_document_share", "mean log-prob": "min_mean_logprob", "entity": "min_entity_share",
                  "binding": "min_binding_share", "binding, sentence": "min_binding_sentence",
                  "peak entity": "min_peak_entity", "claim, after": "min_claim_after",
                  "counterfactual gain": "min_counterfactual"}


def _signal_lines(rows: list[dict]) -> list[str]:
    lines = ["Mean signal values per manual and label (`entity`: `engine.answer.support_entity.entity_share`, "
             "how much of the question is said within 200 characters of the answer's own words on its cited "
             "pages; `binding`: `engine.answer.support_binding.binding_share`, how much of it the sentence holding "
             "them says, with the numbered headings above it):", "",
             "| manual | label | answers | " + " | ".join(SIGNAL_COLUMNS) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in SIGNAL_COLUMNS) + " |"]
    for manual in manuals(rows):
        for kind in ("supported", "unsupported"):
            picked = [r for r in rows if r["document"] == manual and r["kind"] == kind]
            means = []
            for name in SIGNAL_COLUMNS.values():
                values = [r["signals"][name] for r in picked if r["signals"][name] is not None]
                means.append(f"{sum(values) / len(values):.2f}" if values else "–")
            lines.append(f"| {manual} | {kind} | {len(picked)} | " + " | ".join(means) + " |")
    return lines + [""]


def _cost_lines(new: list[dict]) -> list[str]:
    """How long the new manuals' answers took: each manual's first answer apart (it waits for anything the model
    has not done yet on this machine, such as its one-off retrieval-head calibration)."""
    if not new:
        return []
    firsts = {}
    for record in new:
        firsts.setdefault(record["document"], record)
    rest = [r["answer_s"] for r in new if all(r is not first for first in firsts.values())]
    stamps = [r["at"] for r in new if "at" in r]
    wall = f"; {(max(stamps) - min(stamps)) / 60:.0f} min from the first answer to the last" if len(stamps) > 1 else ""
    later = (f"the other {len(rest)}: {sum(rest) / 60:.0f} min in all, median {sorted(rest)[len(rest) // 2]:.0f} s "
             f"an answer" if rest else "no others")
    return [f"Generation (the new manuals' answers, cached in `docs/benchmarks/data/support-held-out.jsonl`; "
            f"manuals asked in parallel, one process each): {len(new)} answers on the 2 busy cores; each manual's "
            f"first answer (it waited for the model's one-off retrieval-head calibration): "
            + ", ".join(f"{r['answer_s']:.0f} s" for r in firsts.values()) + f"; {later}{wall}. The entity signal "
            "itself costs a regex over the cited pages: milliseconds an answer.", ""]

def write_report(model: str, texts: dict[str, str], path: Path = REPORT, answers: Path = ANSWERS,
                 fitted: Path = FITTED_ANSWERS, claims: Path = CLAIMS,
                 counterfactuals: Path = COUNTERFACTUALS, reverses: Path = REVERSES,
                 reasks: Path = REASKS) -> list[str]:
    """Scores the cached answers of the four manuals (``texts``: {manual: its text as the prompt holds it}) and
    writes ``path``; returns its lines."""
    new = [json.loads(line) for line in answers.read_text().splitlines()] if answers.is_file() else []
    new = [r for r in new if r["model"] == model]
    rows = labelled_rows(fitted_records(model, fitted) + new, texts, claim_checks(claims, model),
                         counterfactual_scores(counterfactuals, model), reverse_scores(reverses, model),
                         reask_scores(reasks, model))
    lines = report_lines(rows, new, run_stamp("cpu"), model)
    previous = path.read_text() if path.is_file() else ""
    reading = previous[previous.index(READING):] if READING in previous else ""  # the hand-written part, kept
    path.write_text("\n".join(lines) + "\n" + ("\n" + reading if reading else ""))
    return lines

def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality.support_held_out")
    p.add_argument("--model", default=MODEL)
    p.add_argument("--cache", default=str(_CACHE))
    p.add_argument("--tables-only", action="store_true", help="rewrite the report from the cached answers, no model")
    p.add_argument("--documents", default="", help="ask only these manuals' questions (comma-separated keys)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .support_eval import load_questions as fitted_questions

    documents = load_questions()
    texts = {d["key"]: document_text(d, Path(args.cache)) for d in fitted_questions() + documents}
    if not args.tables_only:
        wanted = set(args.documents.split(",")) if args.documents else {d["key"] for d in documents}
        generate(args.model, [d for d in documents if d["key"] in wanted], texts)
    print("\n".join(write_report(args.model, texts)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
