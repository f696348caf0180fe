"""One tab's conversation with a remote backend (``app.backend_client``), shaped as the page's answers are (text,
TTFT, tokens, tok/s, stopped), so the page renders it with ``app.render`` as it renders our engine's.

The read keeps the documents' text as the prompt's first message and has the backend read it once (one answer token):
every question after sends the same start, which the backend's prefix cache (vLLM's automatic prefix caching,
SGLang's RadixAttention, llama.cpp's slots) reuses instead of reading it again. What needs our engine's own attention
or KV (sources, the support flag, exact reopen, the memory plan) has no counterpart here and is never made up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from app.backend_client import BackendClient

INSTRUCTION = "Answer the questions from these documents.\n\n"


@dataclass(frozen=True)
class RemoteChunk:
    """The answer so far, as the page's stats line needs it."""

    text: str
    num_tokens: int
    ttft: float | None
    tokens_per_second: float
    done: bool = False
    stopped: bool = False
    prompt_tokens: int | None = None  # the backend's count of the whole prompt (on the last chunk)


@dataclass(frozen=True)
class RemoteRead:
    """A read on the backend: the prompt's tokens as it counted them, and how long it took."""

    tokens: int
    seconds: float


class RemoteSession:
    """The documents and the conversation one tab holds, answered by ``model`` on ``client``."""

    def __init__(self, client: BackendClient, model: str):
        self.client, self.model = client, model
        self.document = ""
        self.document_tokens = 0
        self.turns: list[tuple[str, str]] = []

    @property
    def is_prefilled(self) -> bool:
        return bool(self.document) and self.document_tokens > 0

    def prefix(self) -> list[dict]:
        """The prompt's start, the same for every question (what the backend's prefix cache reuses)."""
        return [{"role": "system", "content": INSTRUCTION + self.document}]

    def read(self, text: str) -> RemoteRead:
        """Makes ``text`` the document and has the backend read it; the conversation starts again."""
        self.document, self.document_tokens, self.turns = text, 0, []
        started = time.monotonic()
        self.document_tokens = self.client.count_prompt(self.model, self.prefix())
        return RemoteRead(self.document_tokens, time.monotonic() - started)

    def new_conversation(self) -> None:
        self.turns = []

    def clear(self) -> None:
        """Lets go of the documents and the conversation (a tab closed or idle: ``app.visitor_caps``)."""
        self.document, self.document_tokens, self.turns = "", 0, []

    def ask(self, question: str, *, max_new_tokens: int, temperature: float,
            should_stop: Callable[[], bool] = lambda: False) -> Iterator[RemoteChunk]:
        """Streams the answer to ``question`` after the earlier turns; a whole answer joins the conversation."""
        messages = self.prefix()
        for asked, answered in self.turns:
            messages += [{"role": "user", "content": asked}, {"role": "assistant", "content": answered}]
        messages.append({"role": "user", "content": question})
        started, first, text, pieces = time.monotonic(), None, "", 0
        prompt_tokens = completion_tokens = None
        for delta in self.client.stream_chat(self.model, messages, max_tokens=max_new_tokens,
                                             temperature=temperature, should_stop=should_stop):
            prompt_tokens = delta.prompt_tokens or prompt_tokens
            completion_tokens = delta.completion_tokens or completion_tokens
            if not delta.text:
                continue
            first = first if first is not None else time.monotonic() - started
            text, pieces = text + delta.text, pieces + 1  # a streamed piece is a token on these servers
            yield RemoteChunk(text, pieces, first, _rate(pieces, first, started))
        stopped = should_stop()
        num_tokens = completion_tokens if completion_tokens is not None and not stopped else pieces
        if not stopped and text:
            self.turns.append((question, text))
        yield RemoteChunk(text, num_tokens, first, _rate(num_tokens, first, started), done=True, stopped=stopped,
                          prompt_tokens=prompt_tokens)


def _rate(tokens: int, first: float | None, started: float) -> float:
    """Tokens a second after the first (the page's tok/s counts the writing, not the wait for the first token)."""
    if first is None or tokens < 2:
        return 0.0
    seconds = time.monotonic() - started - first
    return (tokens - 1) / seconds if seconds > 0 else 0.0
