"""The model evaluation's questions: enough of them, each answerable from its own document, scored by regex."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks.model_eval import document_text, load_questions, score

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
