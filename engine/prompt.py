"""Token ids for a document conversation: a fixed document prefix, then the conversation turns.

The document goes in the first user message; everything before the first question is the prefix, and it
is the same for every conversation, so its KV cache is computed once. The turns after it are rendered
with the model's own chat template and tokenized on their own.

By default the first question is glued after the document inside the document's message ("...document\n\nQuestion:
q") and later ones are their own messages. ``question_turn=True`` makes every question a user message of its own, so
a fresh and a later question meet the same prompt; it stays opt-in because it lost SmolLM2's needle answers and
changed nothing on the CPU default model (``docs/benchmarks/support.md``). Templates that refuse two user messages in
a row (roles must alternate) keep the glued layout.
"""

from __future__ import annotations

import bisect
import re
from array import array
from dataclasses import dataclass
from typing import NamedTuple

from .errors import InputError

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful reading assistant. Answer questions using only the documents provided by the user. "
    "Quote or cite page markers like [page 3] when they help. If the documents do not contain the answer, say so."
)
_QUESTION_MARKER = "\x00QUESTION\x00"  # never occurs in real text; marks where the prefix ends

# The page marker: the line before each page of a document, ``[page 37]`` (the number the book prints on it) or
# ``[pdf page 4]`` (a page with no printed number in a book that has them). One writer (``page_marker``, used by the
# app's PDF reader) and one parser (``page_markers``). The parser reads text a document controls (a line "[page 999]"
# in it is a marker to it), so the engine never calls it on a document: a caller gives the pages it wrote
# (``DocumentTokens.pages``), and a library caller whose text is its own may pass ``page_markers(text)`` itself.
_PAGE_MARKER = re.compile(r"^\[(pdf )?page ([^\]\n]{1,24})\]$", re.MULTILINE)


class PageMarker(NamedTuple):
    start: int  # where the marker line starts in the text
    end: int  # where it ends (the page's text follows)
    label: str  # the page's key: its printed label ("37", "xii"), or "PDF 4" for a page without one


def page_marker(label: str | int | None, sequence: int) -> str:
    """The marker line before a page: its printed label, else its PDF sequence."""
    return f"[pdf page {sequence}]" if label is None else f"[page {label}]"


def page_markers(text: str) -> list[PageMarker]:
    """Every page marker line of ``text``, in order."""
    return [PageMarker(m.start(), m.end(), f"PDF {m.group(2)}" if m.group(1) else m.group(2).strip())
            for m in _PAGE_MARKER.finditer(text)]


def checked_pages(pages, length: int) -> tuple[PageMarker, ...]:
    """``pages`` (``PageMarker``s or (start, end, label) triples) as PageMarkers, each within a text of ``length``
    characters and after the one before; ``InputError`` otherwise."""
    checked, last = [], 0
    for page in pages:
        page = PageMarker(*page)
        if not (isinstance(page.label, str) and isinstance(page.start, int) and isinstance(page.end, int)
                and last <= page.start <= page.end <= length):
            raise InputError(f"page {page.label!r} at {page.start}..{page.end} is not in order within the "
                             f"{length:,}-character document")
        checked.append(page)
        last = page.end
    return tuple(checked)



@dataclass(frozen=True)
class Turn:
    question: str
    answer: str


@dataclass(frozen=True, eq=False)
class DocumentTokens:
    """A document tokenized once as the prompt prefix, reused for counting, planning, reading and
    the snapshot identity.

    ``starts`` holds where each token begins in ``text`` (negative for the chat markup before it, past
    the end for the markup after it); ``None`` when the tokenizer cannot tell (slow tokenizers). ``pages``: where
    each page lies in ``text`` as the caller gave them (``PageMarker``: its marker line from ``start``, its text
    from ``end``), in order; the answer's sources are bucketed by these alone (none given: no page sources).
    """

    text: str
    ids: list[int]
    starts: array | None = None
    pages: tuple[PageMarker, ...] = ()

    def __len__(self) -> int:
        return len(self.ids)

    def count_between(self, start: int, end: int) -> int | None:
        """Tokens that begin in ``text[start:end]``; None without ``starts``."""
        if self.starts is None:
            return None
        return bisect.bisect_left(self.starts, end) - bisect.bisect_left(self.starts, start)

    def head(self, num_tokens: int) -> str | None:
        """The text before its ``num_tokens``-th own token (the markup before it not counted); None
        without ``starts``."""
        if self.starts is None:
            return None
        index = bisect.bisect_left(self.starts, 0) + num_tokens
        if index >= len(self.starts):
            return self.text
        return self.text[: max(0, min(self.starts[index], len(self.text)))]


class PromptBuilder:
    """Renders [system + document] | [questions and answers] with a tokenizer's chat template."""

    def __init__(self, tokenizer, system_prompt: str | None = None, *, question_turn: bool = False):
        self.tokenizer = tokenizer
        self.system_prompt = DEFAULT_SYSTEM_PROMPT if system_prompt is None else system_prompt
        # Each question its own user message (``False``, the default: the first glued after the document). The
        # question-turn layout is not the default: on SmolLM2 it lost the needle answers the tests check, and on the CPU
        # default model it changed nothing (fresh 6/8, after turns 7/8 in both layouts; docs/benchmarks/support.md).
        self.question_turn = question_turn and self._accepts_question_turn()

    def document_ids(self, document: str) -> list[int]:
        """The prefix shared by every conversation about ``document``."""
        return self._encode(self.document_text(document))

    def document_text(self, document: str) -> str:
        """The rendered text of that prefix (system prompt, chat markup and the document)."""
        rendered = self._render(document, [], _QUESTION_MARKER)
        return rendered[: rendered.index(_QUESTION_MARKER)]

    def tokenize_document(self, document: str, pages=()) -> DocumentTokens:
        """``document_ids`` with where each token starts in ``document``, in one tokenizer pass; ``pages``
        (``PageMarker``s, character offsets into ``document``) are kept with them, checked, never looked for."""
        pages = checked_pages(pages, len(document))
        rendered = self._render(document, [], _QUESTION_MARKER)
        prefix = rendered[: rendered.index(_QUESTION_MARKER)]
        if not getattr(self.tokenizer, "is_fast", False):
            return DocumentTokens(document, self._encode(prefix), pages=pages)
        encoded = self.tokenizer(prefix, add_special_tokens=False, return_offsets_mapping=True)
        # The document is the first user message: it ends right before the question's own text.
        offset = prefix.rfind(document) if document else len(prefix)
        if offset < 0:  # the template rewrote the text (e.g. trimmed it): no offsets to count by
            return DocumentTokens(document, list(encoded["input_ids"]), pages=pages)
        starts = array("q", (start - offset for start, _ in encoded["offset_mapping"]))
        return DocumentTokens(document, list(encoded["input_ids"]), starts, pages)

    def truncate_document(self, tokens: DocumentTokens, limit: int) -> DocumentTokens:
        """Keeps the beginning of the document so that its prefix ids number at most ``limit``."""
        markup = len(self.document_ids("")) + 8
        keep = max(limit - markup, 1)
        body = None if tokens.starts is not None else self._encode(tokens.text)
        while True:
            # Re-tokenizing a cut text can merge or split a few tokens: shrink until it fits.
            head = tokens.head(keep) if body is None else self.tokenizer.decode(body[:keep])
            # A page whose marker line is cut is no page (as the app's ``Layout.clip`` has it).
            cut = self.tokenize_document(head + "\n[... truncated to fit ...]",
                                         [page for page in tokens.pages if page.end <= len(head)])
            if len(cut) <= limit or keep == 1:
                return cut
            keep = max(keep - (len(cut) - limit) - 1, 1)

    def conversation_ids(self, document: str, turns: list[Turn], question: str) -> list[int]:
        """Ids after the document prefix: earlier turns, the new question and the assistant header."""
        prefix = self._render(document, [], _QUESTION_MARKER)
        prefix = prefix[: prefix.index(_QUESTION_MARKER)]
        full = self._render(document, turns, question)
        if not full.startswith(prefix):
            raise InputError("the chat template does not render the document as a stable prefix")
        return self._encode(full[len(prefix):])

    def _accepts_question_turn(self) -> bool:
        """Whether the chat template renders a question as a user message right after the document's."""
        if not getattr(self.tokenizer, "chat_template", None):
            return True
        try:
            self._render("d", [], _QUESTION_MARKER, question_turn=True)
        except Exception:  # jinja's TemplateError ("roles must alternate"), raised by the template itself
            return False
        return True

    def _render(self, document: str, turns: list[Turn], question: str, *, question_turn: bool | None = None) -> str:
        question_turn = self.question_turn if question_turn is None else question_turn
        messages = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        if question_turn:
            # The document's message is the document alone: the system prompt already says to answer from it only, and
            # every added token would come out of a small model's window.
            messages.append({"role": "user", "content": document})
            for turn in turns:
                messages += [{"role": "user", "content": turn.question}, {"role": "assistant", "content": turn.answer}]
        else:
            first_question = turns[0].question if turns else question
            messages.append({"role": "user", "content": f"{document}\n\nQuestion: {first_question}"})
            for i, turn in enumerate(turns):
                if i > 0:
                    messages.append({"role": "user", "content": turn.question})
                messages.append({"role": "assistant", "content": turn.answer})
        if turns or question_turn:
            messages.append({"role": "user", "content": question})
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # Base models without a template: a plain transcript, opened with the <bos> the tokenizer asks for
        # (add_bos_token, e.g. Gemma's GGUF): ``_encode`` adds no special tokens, since templates write their own.
        lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
        bos = self.tokenizer.bos_token if getattr(self.tokenizer, "add_bos_token", False) else None
        return (bos or "") + "\n\n".join(lines) + "\n\nAssistant:"

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]
