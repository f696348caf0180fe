"""Which held document a request's prompt begins with: the exact KV reuse behind the API.

A request's prompt is its messages rendered with the model's own chat template (``render``). A document the app
holds has a prefix: the text its K/V was computed from, the page's system prompt and chat markup included
(``session.prompts.document_text``). When the prompt's text begins with that prefix, the prompt's ids are the
document's own ids followed by the rest of the text tokenized on its own, exactly as the page tokenizes a question
after its document (``PromptBuilder.conversation_ids``), so a request laid out as the page lays out its conversation
gets the very ids, and the very answer, of the page. The longest prefix wins; held K/V beats a shelf copy of the same
length. Candidates:

- the page tabs' read documents (only when the app is not shared: a visitor's document is theirs alone), each used
  in its own session while its tab is idle (marked busy, so its Clear or New chat waits);
- the shelf's saved documents (the owner's shelf), restored into the API's own session from disk, across restarts;
- the API's own session: the last shelf document it restored, or the last prompt that matched nothing, read whole as
  its document, so a script's growing conversation reuses every earlier turn.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from app.app_state import AppState
from app.browser_state import BrowserState
from app.pieces import rejoin
from app.saved.saved_docs import SavedDocs
from engine import DocumentSession
from engine.types import DocumentTokens

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Held:
    """A document a prompt may begin with. ``session``: where its K/V is (None: on the shelf, under ``key``)."""

    kind: str  # "tab", "shelf" or "api"
    label: str
    prefix: str  # the rendered text the document's ids were computed from
    session: DocumentSession | None = None
    state: BrowserState | None = None  # the tab whose session it is
    key: str | None = None  # the shelf's key
    text: str = ""  # a shelf document's text, as its session takes it
    num_tokens: int = 0  # its ids (a shelf copy's as saved)

    def tokens(self) -> int:
        return self.session.document_tokens if self.session is not None else self.num_tokens


@dataclass(frozen=True)
class Match:
    """The prompt split at the document it begins with (``held`` None: no held document; ``prompt`` is read whole)."""

    held: Held | None
    prompt: str
    rest: str  # the prompt after the document's prefix


def render(tokenizer, messages: tuple[tuple[str, str], ...]) -> str:
    """The prompt of a chat request: its messages through the model's chat template, with the assistant's header."""
    turns = [{"role": role, "content": text} for role, text in messages]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    return "\n\n".join(f"{t['role'].capitalize()}: {t['content']}" for t in turns) + "\n\nAssistant:"


class Library:
    """The documents the API may answer from, and the API's own session (made on first use)."""

    def __init__(self, app: AppState, *, private: bool, shelf: SavedDocs | None = None):
        self.app, self.private = app, private
        self.shelf = shelf if shelf is not None else app.shelves.for_request(None)
        self.session: DocumentSession | None = None
        self.api_prefix = ""  # the rendered text the API session's document ids were computed from
        self._prefixes: dict[int, tuple[str, str]] = {}  # id(session) -> (its document, its prefix)
        self._shelf_texts: dict[str, tuple[str, str]] = {}  # shelf key -> (document text, prefix)

    def own_session(self) -> DocumentSession:
        if self.session is None or getattr(self.session, "retired", None):
            self.session, self.api_prefix = self.app.new_session(), ""
        return self.session

    def tokenizer(self):
        return self.own_session().tokenizer

    def held(self) -> list[Held]:
        """Every document a prompt may begin with now."""
        found = []
        own = self.own_session()
        if own.is_prefilled and self.api_prefix:
            found.append(Held("api", "the API's last document", self.api_prefix, own))
        if not self.private:
            for tab, state in list(self.app.tabs.items()):
                session = state.session
                if session is None or state.is_closed or state.is_busy or not session.is_prefilled or \
                        getattr(session, "retired", None):
                    continue
                found.append(Held("tab", f"tab {tab[:6]}", self._prefix(session), session, state))
        found += self._shelf()
        return found

    def match(self, prompt: str) -> Match:
        best = None
        for held in self.held():
            if prompt.startswith(held.prefix) and (best is None or len(held.prefix) > len(best.prefix)):
                best = held
        return Match(best, prompt, prompt[len(best.prefix):] if best is not None else prompt)

    def _prefix(self, session: DocumentSession) -> str:
        document, prefix = self._prefixes.get(id(session), (None, ""))
        if document is not session.document:
            prefix = session.prompts.document_text(session.document)
            self._prefixes[id(session)] = (session.document, prefix)
        return prefix

    def _shelf(self) -> list[Held]:
        if not self.shelf.enabled:
            return []
        infos, _ = self.shelf.list()
        found = []
        prompts = self.own_session().prompts
        for info in infos:
            if not info.is_readable or info.is_partial:
                continue
            if info.key not in self._shelf_texts:
                entry = self.shelf.entry(info.key)
                if entry is None:
                    continue
                text = rejoin(entry.text, entry.documents)
                self._shelf_texts[info.key] = (text, prompts.document_text(text))
            text, prefix = self._shelf_texts[info.key]
            found.append(Held("shelf", info.label, prefix, key=info.key, text=text, num_tokens=info.num_tokens))
        return found

    # -- at the front of the device's line ----------------------------------------------------------
    def take(self, match: Match, ids_of, should_stop) -> tuple[DocumentSession, list[int], int]:
        """The session to answer in and the ids after its document (``ids_of(text)`` tokenizes), the matched document
        in place: a shelf copy restored (read again if the copy cannot be used), a prompt matching nothing read whole
        as the API session's document. Returns (session, continuation, tokens read here)."""
        held = match.held
        if held is not None and held.session is not None:
            return held.session, ids_of(match.rest), 0
        session = self.own_session()
        if held is not None:  # a shelf document: restore its K/V into the API's session
            session.set_document(session.tokenize(held.text))
            self.api_prefix = held.prefix
            stats = self.shelf.restore(session)
            read = 0
            if not session.is_prefilled:
                logger.info("the saved copy of %r could not be used whole: reading the rest", held.label)
                read = session.document_tokens - (stats.num_tokens if stats is not None else 0)
                session.prefill(should_stop=should_stop)
            return session, ids_of(match.rest), read
        session.set_document(DocumentTokens(match.prompt, ids_of(match.prompt)))
        self.api_prefix = ""  # until it is read: a stopped read leaves no document to match
        session.prefill(should_stop=should_stop)
        self.api_prefix = match.prompt
        return session, [], session.document_tokens
