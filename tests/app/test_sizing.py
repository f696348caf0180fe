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
    limit = 200_000
    assert far_beyond("a.txt", 4 * 4 * limit, limit, "reason") is None  # 800,000 tokens: truncation is offered
    message = far_beyond("a.txt", 4 * 4 * limit + 4, limit, "this model reads at most 200,000 tokens")
    assert message == ("a.txt: about 800,001 tokens, far beyond the 200,000 tokens a document may take here "
                       "(this model reads at most 200,000 tokens), and more than the 400,000 a page range is "
                       "chosen from. Split it, or use a long-context model.")


def test_a_whole_book_is_read_for_a_page_range_however_small_the_window():
    assert far_beyond("book.pdf", 4 * 400_000, 7_168, "reason") is None  # 400K tokens: a range can be chosen
    assert far_beyond("book.pdf", 4 * 400_000 + 4, 7_168, "reason") is not None


def test_only_plain_text_is_sized_by_its_bytes(tmp_path):
    big = tmp_path / "big.txt"
    with big.open("wb") as out:
        out.truncate(2 * 10**6)
    assert "big.txt (1.91 MiB of text): about 500,000 tokens" in file_far_beyond(str(big), "big.txt", 1000, "r")
    assert file_far_beyond(str(big), "big.pdf", 1000, "r") is None  # compressed formats: sized once extracted
    assert file_far_beyond(str(tmp_path / "gone.txt"), "gone.txt", 1000, "r") is None  # reading reports it
