"""Puts the OpenAI-compatible routes on the app's server: ``Blocks.launch`` passes ``app_kwargs`` to Gradio's FastAPI
app, whose ``routes`` come before Gradio's own, inside the same middleware (the guard, the CSP) as the page."""

from __future__ import annotations

from collections.abc import Callable

from app.openai_api.gate import api_lifespan
from app.openai_api.library import Library
from app.openai_api.routes import OpenAIRoutes
from app.saved.saved_docs import SavedDocs


def with_api(options: dict, demo, *, private: bool, key: str | None, model_name: Callable[[], str]) -> dict:
    """``launch_options`` with the API's routes added; ``demo``: ``app.ui.build_ui``'s page, whose line, tabs and
    shelf the API shares. ``private``: others reach the app, so the API sees no visitor's tab (the owner's shelf
    only)."""
    state = demo.studio_state
    shelf = SavedDocs(state.shelves.store)  # the owner's shelf (the one shared shelf when nobody else reaches the app)
    library = Library(state, private=private, shelf=shelf)
    routes = OpenAIRoutes(library, model_name, key).routes()
    kwargs = dict(options.get("app_kwargs", {}))
    kwargs["routes"] = [*kwargs.get("routes", []), *routes]
    kwargs["lifespan"] = api_lifespan(kwargs.get("lifespan"), key)  # the key checked first, before any body is read
    return {**options, "app_kwargs": kwargs}
