"""The support flag held out by manual (benchmarks.quality.support_held_out): fits that never see the manual they judge, and
the report from cached answers (no model)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.quality import support_held_out as held_out

MANUALS = ("m1", "m2", "m3", "m4")


def _row(manual: str, kind: str, share: float, entity: float) -> dict:
    return {"document": manual, "kind": kind,
            "signals": {"min_document_share": share, "min_mean_logprob": -0.1, "min_entity_share": entity,
                        "min_grounded_share": None, "min_asked_share": None}}


def _rows() -> list[dict]:
    rows = []
    for k, manual in enumerate(MANUALS):
        rows += [_row(manual, "supported", 0.6 + 0.02 * i + 0.01 * k, 0.9) for i in range(6)]
        # Half the invented answers look off the pages; the other half copy a neighbour (on the pages, wrong entity).
        rows += [_row(manual, "unsupported", 0.3 + 0.02 * i, 0.9) for i in range(2)]
        rows += [_row(manual, "unsupported", 0.7, 0.5 + 0.02 * i) for i in range(2)]
    return rows


def test_leave_one_manual_out_fits_on_the_other_manuals_only():
    rows = _rows()
    seen = []

    def spy(train, names):
        seen.append({row["document"] for row in train})
        return held_out.fit_rows(train, names)

    flags = held_out.leave_one_manual_out(rows, ("min_document_share", "min_entity_share"), spy)
    assert seen == [set(MANUALS) - {manual} for manual in MANUALS]  # one fit per manual, never on it
    assert set(flags) == set(MANUALS)
    # Fitted on the three others, each manual's answers are judged: both kinds of invented answer caught.
    assert held_out.rates(rows, flags) == (1.0, 0.0)
    # Without the entity signal the copied neighbours pass.
    assert held_out.rates(rows, held_out.leave_one_manual_out(rows, ("min_document_share",)))[0] == 0.5


def test_the_whole_choice_held_out_never_fits_or_picks_on_the_manual_it_judges(monkeypatch):
    """Every judgement (the inner ones that pick the rule, and the outer one that scores a manual) follows a fit
    whose rows hold none of the judged manual's answers; no fit ever sees all four manuals."""
    rows = _rows()
    log = []

    def spy(train, names):
        log.append(("fit", {row["document"] for row in train}))
        return held_out.fit_rows(train, names)

    judged = held_out.judged

    def judging(test, names, thresholds):
        log.append(("judged", {row["document"] for row in test}))
        return judged(test, names, thresholds)

    monkeypatch.setattr(held_out, "judged", judging)
    flags, picked = held_out.chosen_held_out(rows, {"share": ("min_document_share",),
                                                    "share + entity": ("min_document_share", "min_entity_share")},
                                             spy)
    assert all(docs != set(MANUALS) for what, docs in log if what == "fit")
    for i, (what, docs) in enumerate(log):
        if what == "judged":
            fit = next(d for w, d in reversed(log[:i]) if w == "fit")
            assert not fit & docs, (docs, fit)
    outer = [(log[i - 1][1], docs) for i, (what, docs) in enumerate(log) if what == "judged" and i > 0
             and log[i - 1][0] == "fit" and len(log[i - 1][1]) == len(MANUALS) - 1]
    assert sorted(tuple(sorted(docs)) for _, docs in outer) == [(m,) for m in MANUALS]
    assert set(picked.values()) == {"share + entity"} and held_out.rates(rows, flags) == (1.0, 0.0)


def test_attention_peaks_are_the_documents_most_attended_tokens_in_characters():
    import torch

    mass = torch.zeros(12, dtype=torch.float64)  # [L]: 4 sink, a markup token, document tokens, the question
    mass[:4] = 100.0  # the attention sink counts for nothing
    mass[4], mass[7], mass[9], mass[11] = 5.0, 3.0, 1.0, 1.0
    starts = [-10, -9, -8, -7, -1, 0, 6, 12, 18, 24]  # a token of chat markup (negative) before the text
    peaks = held_out.attention_peaks(mass, starts, first=5, top=2)
    assert peaks == [[12, 0.3], [24, 0.1]]  # positions 7 and 9; 11 is past the document, 4 before the first page


@pytest.mark.parametrize("with_answers", [True, False])
def test_the_report_is_written_from_cached_answers_per_held_out_manual(tmp_path, with_answers):
    """The benchmark's tables end to end on answers recorded as ``generate`` records them (four tiny manuals)."""
    texts, fitted, new = {}, [], []
    for k, manual in enumerate(MANUALS):
        windows = f"R {k}.1.3 was the last version of R to support 32-bit Windows {k}."
        mac = f"The port of R for macOS {k} is maintained by Simon Urbanek{k}."
        filler = "\n".join(f"Filler line {i} about CRAN mirrors {k}." for i in range(6))
        texts[manual] = f"[page 1]\n{windows}\n{filler}\n[page 2]\n{mac}\n{filler}"
        asked = [("Which was the last version of R to support 32-bit Windows?", f"R {k}.1.3.", "supported", True),
                 ("Who maintains the port of R for macOS?", f"Simon Urbanek{k}.", "supported", True),
                 ("Which was the last version of R to support 32-bit macOS?", f"R {k}.1.3.", "unsupported", False),
                 ("Who maintains the port of R for Windows?", f"Simon Urbanek{k}.", "unsupported", False),
                 ("What is the oldest Windows?", "It does not say.", "unsupported", True)]
        for j, (question, answer, kind, correct) in enumerate(asked):
            record = {"model": held_out.MODEL, "weights": "gguf", "layout": "glued", "chat": "fresh",
                      "document": manual, "question": question, "kind": kind, "answer": answer, "correct": correct,
                      "document_share": 0.6, "mean_logprob": -0.1 - 0.01 * j, "sources": [["1", 0.5], ["2", 0.5]],
                      "token_logprobs": [-0.1], "answer_s": 60.0, "at": 1000.0 + 60 * j, "peaks": []}
            (fitted if k < 2 else new).append(record)
    answers, fitted_path, report = tmp_path / "new.jsonl", tmp_path / "fitted.jsonl", tmp_path / "report.md"
    fitted_path.write_text("".join(json.dumps(r) + "\n" for r in fitted))
    # The claim check reached the new manuals only (as ``support_claim`` caches it): yes for the right answers.
    claims = tmp_path / "claims.jsonl"
    claims.write_text("".join(json.dumps({"model": held_out.MODEL, "document": r["document"], "question": r["question"],
                                          "yes_after": 0.9 if r["kind"] == "supported" else 0.2}) + "\n" for r in new))
    if with_answers:
        answers.write_text("".join(json.dumps(r) + "\n" for r in new))
    # The counterfactual scoring reached every manual: a right answer loses log-prob under the swapped question.
    swaps = tmp_path / "counterfactual.jsonl"
    swaps.write_text("".join(json.dumps({"model": held_out.MODEL, "document": r["document"], "question": r["question"],
                                         "gain": 0.5 if r["kind"] == "supported" else -0.2, "score_s": 4.0,
                                         "answer_tokens": 5}) + "\n" for r in fitted + new))
    # The reverse scoring reached every manual: the word asked fills the blank for a right answer, a rival for a copy.
    reverses = tmp_path / "reverse.jsonl"
    reverses.write_text("".join(json.dumps({
        "model": held_out.MODEL, "document": r["document"], "question": r["question"],
        "reverse_margin": 1.5 if r["kind"] == "supported" else -0.5, "own_gain": 0.0, "counterfactual_s": 3.0,
        "reverse_s": 2.0, "asked_logprobs": [-0.1, -0.2], "swapped_logprobs": [-0.4, -0.5],
        "max_abs_vs_decode": 0.00004}) + "\n" for r in fitted + new))
    # The re-ask reached every manual: a copy's re-answer says its string again, a right answer's another one.
    reasks = tmp_path / "reask.jsonl"
    reasks.write_text("".join(json.dumps({
        "model": held_out.MODEL, "document": r["document"], "question": r["question"], "reask_s": 2.5,
        "reanswer_tokens": 10, "reask_overlap": 0.0 if r["kind"] == "supported" else 1.0}) + "\n" for r in fitted + new))
    lines = held_out.write_report(held_out.MODEL, texts, report, answers, fitted_path, claims, swaps, reverses, reasks)
    text = report.read_text()
    assert text == "\n".join(lines) + "\n"
    judged = MANUALS if with_answers else MANUALS[:2]
    assert "| rule | " + " | ".join(judged) + " | overall | target (>= 70% / <= 10%) |" in text
    for rule in ["today's shipped thresholds (share + log-prob)", *held_out.RULES, "the whole choice held out"]:
        assert any(line.startswith(f"| {rule} | ") for line in lines), rule
    if with_answers:
        # The copied neighbours pass today's rule (on the pages, surely written) and the entity rule catches them.
        assert "| entity | " + " | ".join(["100% / 0%"] * 5) + " | **met** |" in text
        # The binding signal too: each copied string's sentence names the other platform.
        assert "| share + binding | " + " | ".join(["100% / 0%"] * 5) + " | **met** |" in text
        # The claim check's table covers the manuals it reached, fitted on the one, judged on the other.
        assert "| claim check, after the answer | " + " | ".join(["100% / 0%"] * 3) + " |" in text
        assert "| today's shipped thresholds (share + log-prob) | " + " | ".join(["0% / 0%"] * 5) in text
        # The counterfactual table: the gain alone separates them, and so does the choice made without each manual.
        assert "| counterfactual | " + " | ".join(["100% / 0%"] * 5) + " | **met** |" in text
        assert sum(line.startswith("| the whole choice held out | ") for line in lines) == 4
        # The re-ask's dated section comes first; the overlap alone separates them.
        assert text.index("## 2026-12-02: the rival's question re-asked") < text.index("## 2026-12-02: the reverse")
        assert "| reask | " + " | ".join(["100% / 0%"] * 5) + " | **met** |" in text
        assert "| m1 | unsupported | 2 | 1.00 | 2 |" in text and "2.5 s an answer" in text
        # The reverse question's dated section leads the report; the margin alone separates them, the own-token
        # gain (equal for both kinds here) flags nothing, and the scoring's agreement with the decode is stated.
        top = text.index("## 2026-12-02: the reverse question and the own-token gain")
        assert top < text.index("Model: ")
        assert held_out.READING not in text  # the kept hand-written part starts at its first mention
        assert "| reverse margin | " + " | ".join(["100% / 0%"] * 5) + " | **met** |" in text
        assert "| own-token gain | " + " | ".join(["0% / 0%"] * 5) + " | not met |" in text
        assert "largest difference 0.00004 over 16 answers" in text
        assert "| m1 | supported | 1.50 (2) | 0.00 (2) | 0.30 (2) |" in text
        assert "4.0 s an answer" in text
        assert "Generation (the new manuals' answers" in text and "10 answers on the 2 busy cores" in text
    else:
        assert "Generation" not in text and "The claim check" not in text


def test_the_held_out_set_has_new_manuals_and_enough_look_alikes():
    """The issue's set: two manuals not in support_eval's, >= 16 look-alike questions each naming the neighbouring
    string that answers it wrongly, and questions the pages answer."""
    import re

    from benchmarks.quality.support_eval import load_questions as fitted

    documents = held_out.load_questions()
    assert not {d["key"] for d in documents} & {d["key"] for d in fitted()}
    questions = [q for d in documents for q in d["questions"]]
    look_alikes = [q for q in questions if q["kind"] == "unsupported"]
    assert len(look_alikes) >= 16 and all(q["neighbour"] for q in look_alikes)
    assert sum(q["kind"] == "supported" for q in questions) >= 12
    assert len({q["q"] for q in questions}) == len(questions)
    for q in questions:
        re.compile(q["regex"])
    assert np.all([set(q) >= {"q", "kind", "half", "regex"} for q in questions])
