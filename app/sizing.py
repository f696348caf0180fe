"""Sizing a document set before work: per-file token counts from the one tokenization of the set."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from app.documents import Document
from engine import DocumentTokens


def document_spans(documents: Sequence[Document]) -> list[tuple[int, int]]:
    """Where each document's own text lies in ``combine(documents)`` (whose layout this follows)."""
    spans, offset = [], 0
    for doc in documents:
        start = offset + len(f"=== {doc.name} ===\n")
        spans.append((start, start + len(doc.text)))
        offset = start + len(doc.text) + len("\n\n")
    return spans


def token_counts(tokens: DocumentTokens, documents: Sequence[Document], count: Callable[[str], int]) -> list[int]:
    """Tokens per document, read off the set's tokenization; ``count(text)`` only for tokenizers that give
    no offsets (slow ones), which then tokenize each file once more."""
    counts = [tokens.count_between(start, end) for start, end in document_spans(documents)]
    if any(n is None for n in counts):
        return [count(doc.text) for doc in documents]
    return counts
