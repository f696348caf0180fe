"""Shared (``--share``, logins, a non-loopback host), the API answers from its own session and the owner's shelf,
never from a visitor's tab (``app.openai_api.library``, ``private``): a client with the key would otherwise read a
visitor's document by sending a prompt that begins with it. Alone on loopback, the owner's own tabs are reusable."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.browser_state import BrowserState
from app.openai_api.library import Library
from app.saved.saved_docs import SavedDocs

DOCUMENT = "The visitor's contract: the price is 41,000 euros."


class _Prompts:
    system_prompt = ""

    @staticmethod
    def document_text(document: str) -> str:
        return f"<doc>{document}</doc>"


def _read_session(document: str | None) -> SimpleNamespace:
    """A session as the library reads one: its document, whether it is read, and its prompt's layout."""
    return SimpleNamespace(document=document, is_prefilled=document is not None, prompts=_Prompts(), retired=None)


@pytest.mark.parametrize(("private", "reused"), [(True, False), (False, True)])
def test_a_visitors_tab_is_never_a_prefix_the_api_reuses_when_shared(private, reused):
    tab = BrowserState(session=_read_session(DOCUMENT))
    app = SimpleNamespace(tabs={"visitor-tab-1": tab}, new_session=lambda: _read_session(None))
    library = Library(app, private=private, shelf=SavedDocs(None))
    kinds = [held.kind for held in library.held()]
    assert (kinds == ["tab"]) is reused and (kinds == []) is not reused
    match = library.match(f"<doc>{DOCUMENT}</doc>\n\nQuestion: what is the price?")
    assert (match.held is not None) is reused
