"""``GET /v1/documents``: the held documents and the messages a client starts its chat with to reuse one's K/V.

The page lays a conversation out as the app's system prompt, then one user message holding the document and the
first question ("<document>\n\nQuestion: <question>"), then the turns (``engine.prompt.PromptBuilder``). A client that
sends those messages (the listed ``messages``, its question appended to the last one's content, later turns after it)
renders the very prefix the document was read as, so its prompt matches (``app.openai_api.library``). Each listed
layout is checked by rendering it: a template that renders it otherwise lists none rather than a wrong one.
"""

from __future__ import annotations

from app.openai_api.library import Library, render

QUESTION = "\n\nQuestion: "


def documents_listing(library: Library) -> list[dict]:
    own = library.own_session()
    listing = []
    for held in library.held():
        if held.kind == "api":  # a prompt read whole: the client that sent it has its messages
            messages = None
        else:
            document = held.session.document if held.session is not None else held.text
            messages = page_messages(library, (held.session or own).prompts.system_prompt, document, held.prefix)
        listing.append({"id": f"{held.kind}:{held.key or held.label}", "object": "document", "kind": held.kind,
                        "label": held.label, "tokens": held.tokens(), "messages": messages})
    return listing


def page_messages(library: Library, system: str, document: str, prefix: str) -> list[dict] | None:
    """The page's layout of ``document``'s first question, its question left for the client to append; None when
    the chat template does not render it as ``prefix``."""
    messages = ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": document + QUESTION}]
    probe = tuple((m["role"], m["content"]) for m in messages[:-1]) + (("user", document + QUESTION + "?"),)
    return messages if render(library.tokenizer(), probe).startswith(prefix) else None
