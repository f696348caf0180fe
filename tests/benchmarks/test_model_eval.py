"""The model evaluation's questions: enough of them, each answerable from its own document, scored by regex."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks.quality.model_eval import document_text, load_questions, score

CACHE = Path.home() / ".cache" / "headinfer-studio" / "eval-docs"


def test_at_least_thirty_questions_over_several_real_documents():
    documents = load_questions()
    assert sum(len(d["questions"]) for d in documents) >= 30 and len(documents) >= 5
    assert {d["member"].split(".")[-1] for d in documents} >= {"html", "pdf", "gz"}  # HTML and PDF manuals


def test_scoring_is_a_case_insensitive_search():
    assert score("Use the `&>>` operator.", "&>>")
    assert score("It is NOCLOBBER.", "noclobber")
    assert not score("Installed versions get 1000.", "\\b100\\b")


def test_every_answer_is_in_its_document():
    """A question whose expected answer is not in the text it is asked about would score nothing but the model."""
    try:
        texts = {d["key"]: document_text(d, CACHE) for d in load_questions()}
    except (OSError, subprocess.SubprocessError) as error:  # no apt-get or no network here
        pytest.skip(f"the Debian manuals could not be fetched: {error}")
    for document in load_questions():
        text = texts[document["key"]]
        assert 4_000 < len(text) < 30_000, document["key"]  # about 2-6K tokens: a 2-core CPU reads it in minutes
        for question in document["questions"]:
            assert score(text, question["regex"]), (document["key"], question["q"])


def test_a_row_per_weights_mode_and_the_hand_written_reading_kept(tmp_path):
    from benchmarks.quality.model_eval import READING, write_markdown

    def answer(weights, correct, document="doc-a"):
        record = {"model": "qwen", "title": "Qwen", "license": "x", "window": 32768, "load_s": 1.0,
                  "document": document, "document_tokens": 100, "read_s": 2.0, "question": "q", "answer": "a",
                  "correct": correct, "answer_tokens": 9, "ttft_s": 0.1, "decode_tok_s": 4.0, "answer_s": 2.0}
        return record if weights is None else {**record, "weights": weights}

    path = tmp_path / "model-eval.md"
    path.write_text(f"# old tables\n\n{READING} (by hand)\n\nWhy the models missed.\n")
    records = [answer(None, True), answer(None, False), answer("gguf", True), answer("gguf", True, "doc-b")]
    write_markdown(records, {"machine": "vm", "load_avg": [1], "torch": "t", "transformers": "t",
                             "date": "2026-11-25"}, path)
    text = path.read_text()
    assert "| Qwen | 1/2 (50%) |" in text and "| Qwen · GGUF blocks | 2/2 (100%) |" in text  # old records: dense
    assert "| qwen | 1 | 0 |" in text and "| qwen · gguf | 1 | 1 |" in text
    assert "old tables" not in text and text.endswith(f"{READING} (by hand)\n\nWhy the models missed.\n")
