"""Sizing before work: spans that follow ``combine``, and refusals with the numbers."""

from __future__ import annotations

from app.documents import Document, combine
from app.sizing import document_spans, far_beyond, file_far_beyond


def test_spans_locate_each_document_in_the_combined_text():
    documents = [Document("a.txt", "txt", "Hello there."), Document("b.md", "md", "Second\n\nfile."),
                 Document("c.pdf", "pdf", "[page 1]\nThird.", pages=1)]
    combined = combine(documents)
    assert [combined[start:end] for start, end in document_spans(documents)] == [d.text for d in documents]


def test_far_beyond_is_four_times_the_limit_and_says_the_numbers():
    assert far_beyond("a.txt", 4 * 4 * 1000, 1000, "reason") is None  # 4,000 tokens: truncation is offered
    message = far_beyond("a.txt", 4 * 4 * 1000 + 4, 1000, "this model reads at most 1,024 tokens")
    assert message == ("a.txt: about 4,001 tokens, far beyond the 1,000 tokens a document may take here "
                       "(this model reads at most 1,024 tokens). Split it, or use a long-context model.")


def test_only_plain_text_is_sized_by_its_bytes(tmp_path):
    big = tmp_path / "big.txt"
    with big.open("wb") as out:
        out.truncate(10**6)
    assert "big.txt (976.56 KiB of text): about 250,000 tokens" in file_far_beyond(str(big), "big.txt", 1000, "r")
    assert file_far_beyond(str(big), "big.pdf", 1000, "r") is None  # compressed formats: sized once extracted
    assert file_far_beyond(str(tmp_path / "gone.txt"), "gone.txt", 1000, "r") is None  # reading reports it
