"""Sizing a document set before work: refusing what is far beyond the context limit from its size alone
(before reading or tokenizing it), and per-file token counts from the one tokenization of the set."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from app.documents import Box, Document, DocumentError, finish, shared_box
from app.documents.limits import MAX_TEXT_CHARS
from engine import format_bytes
from engine.types import DocumentTokens

CHARS_PER_TOKEN = 4  # English prose averages ~4 characters per token; denser scripts take more tokens
FAR_BEYOND = 4  # refused unread when estimated at this many times the limit (up to it, truncation is offered)...
WHOLE_BOOK_TOKENS = 400_000  # ...and past this (a 1,600-page book): up to it a page range of the book can be read
_PLAIN_TEXT_SUFFIXES = (".txt", ".md", ".markdown", ".html", ".htm")  # a byte is about a character


def estimate_tokens(num_chars: int) -> int:
    """Tokens a text of ``num_chars`` characters takes, roughly, before tokenizing it."""
    return num_chars // CHARS_PER_TOKEN


def far_beyond(what: str, num_chars: int, limit: int, reason: str) -> str | None:
    """Why ``what`` (``num_chars`` characters) is refused unread, with the numbers; None when it may be read."""
    estimate = estimate_tokens(num_chars)
    if estimate <= max(FAR_BEYOND * limit, WHOLE_BOOK_TOKENS):
        return None
    return (f"{what}: about {estimate:,} tokens, far beyond the {limit:,} tokens a document may take here "
            f"({reason}), and more than the {WHOLE_BOOK_TOKENS:,} a page range is chosen from. Split it, or use a "
            "long-context model.")


def file_far_beyond(path: str, name: str, limit: int, reason: str) -> str | None:
    """``far_beyond`` for a plain-text file from its size on disk, so a huge one is never read into memory."""
    if Path(name).suffix.lower() not in _PLAIN_TEXT_SUFFIXES:
        return None
    try:
        size = Path(path).stat().st_size
    except OSError:
        return None  # reading it reports the problem
    return far_beyond(f"{name} ({format_bytes(size)} of text)", size, limit, reason)


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


def read_sized(paths: Sequence[str], limit: int, reason: str,
               box: Box | None = None) -> tuple[list[Document], list[str]]:
    """The files as text, and why others were skipped (or cut), each naming its file. Each is sized first (a
    plain-text file by its bytes, others once extracted, the set as a whole too), so what is far beyond ``limit``
    tokens is refused before it is read or tokenized. They are read in ``box`` (the app's shared one by default):
    an upload is untrusted, and a bomb among them is refused on its own while the others read."""
    box = box or shared_box()
    documents, problems = [], []
    for path in paths:
        name = Path(path).name
        problem = file_far_beyond(path, name, limit, reason)
        if problem is None:
            try:
                extracted = box.extract(path, name)
                document = finish(extracted)
                problem = far_beyond(name, document.chars, limit, reason)
            except DocumentError as exc:
                problem = str(exc)
        if problem is None:
            documents.append(document)
            if extracted.cut_from is not None:
                problems.append(f"{name}: the text after its first {MAX_TEXT_CHARS:,} characters (of "
                                f"{extracted.cut_from:,}), more than any model here can read.")
        else:
            problems.append(problem)
    together = sum(doc.chars for doc in documents)
    if len(documents) > 1 and (problem := far_beyond("These files together", together, limit, reason)):
        return [], problems + [problem]
    return documents, problems
