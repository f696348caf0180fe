"""Token ids for a document conversation: a fixed document prefix, then the conversation turns.

The document goes in the first user message; everything before the first question is the prefix, and it
is the same for every conversation, so its KV cache is computed once. The turns after it are rendered
with the model's own chat template and tokenized on their own.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful reading assistant. Answer questions using only the documents provided by the user. "
    "Quote or cite page markers like [page 3] when they help. If the documents do not contain the answer, say so."
)
_QUESTION_MARKER = "\x00QUESTION\x00"  # never occurs in real text; marks where the prefix ends


@dataclass(frozen=True)
class Turn:
    question: str
    answer: str


class PromptBuilder:
    """Renders [system + document] | [questions and answers] with a tokenizer's chat template."""

    def __init__(self, tokenizer, system_prompt: str | None = None):
        self.tokenizer = tokenizer
        self.system_prompt = DEFAULT_SYSTEM_PROMPT if system_prompt is None else system_prompt

    def document_ids(self, document: str) -> list[int]:
        """The prefix shared by every conversation about ``document``."""
        return self._encode(self.document_text(document))

    def document_text(self, document: str) -> str:
        """The rendered text of that prefix (system prompt, chat markup and the document)."""
        rendered = self._render(document, [], _QUESTION_MARKER)
        return rendered[: rendered.index(_QUESTION_MARKER)]

    def conversation_ids(self, document: str, turns: list[Turn], question: str) -> list[int]:
        """Ids after the document prefix: earlier turns, the new question and the assistant header."""
        prefix = self._render(document, [], _QUESTION_MARKER)
        prefix = prefix[: prefix.index(_QUESTION_MARKER)]
        full = self._render(document, turns, question)
        if not full.startswith(prefix):
            raise ValueError("the chat template does not render the document as a stable prefix")
        return self._encode(full[len(prefix):])

    def _render(self, document: str, turns: list[Turn], question: str) -> str:
        first_question = turns[0].question if turns else question
        messages = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": f"{document}\n\nQuestion: {first_question}"})
        for i, turn in enumerate(turns):
            if i > 0:
                messages.append({"role": "user", "content": turn.question})
            messages.append({"role": "assistant", "content": turn.answer})
        if turns:
            messages.append({"role": "user", "content": question})
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # Base models without a template: a plain transcript.
        lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
        return "\n\n".join(lines) + "\n\nAssistant:"

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]
