"""A tab's state belongs to the login that first used it: Gradio finds a tab's ``gr.State`` by its session hash
alone, so another logged-in visitor who sends that hash would otherwise ask of, stop or clear someone else's tab.

``owned`` wraps a handler that takes ``state``: it adds a ``request: gr.Request`` parameter (so Gradio passes the
request), binds the tab to ``request.username`` on first use, and refuses (``gr.Error``, nothing done) a request
whose username differs. Without a login both usernames are None, so nothing changes there; a state that sets
``owned_by_browser`` (the ``--backend`` page's tabs) is bound to the browser's id cookie too (``app.browser_id``), so
there another browser sending the hash is refused as well."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable

import gradio as gr

from app.browser_id import browser_id
from app.browser_state import BrowserState

logger = logging.getLogger(__name__)

NOT_YOURS = "This tab belongs to another login or browser; nothing was done."


def is_owner(state: BrowserState, request: gr.Request | None) -> bool:
    """Whether ``request`` may act on ``state`` (binding an unbound tab to its username, and to its browser's id
    too for a state that asks, ``owned_by_browser``). A direct call (no request, or one without a session) is the
    app's own and always may."""
    if request is None or not getattr(request, "session_hash", None):
        return True
    who = getattr(request, "username", None)
    if getattr(state, "owned_by_browser", False):  # without a login, another browser sending the hash is not it
        who = (who, browser_id(request))
    if not state.owner_bound:
        state.owner, state.owner_bound = who, True
        return True
    return state.owner == who


def owned(fn: Callable) -> Callable:
    """``fn`` refusing a request from another login than its tab's (see the module's text); ``fn`` unchanged when
    it takes no ``state``."""
    signature = inspect.signature(fn)
    if "state" not in signature.parameters:
        return fn
    passes_request = "request" in signature.parameters
    params = list(signature.parameters.values())
    if not passes_request:  # keyword-compatible, after the others: Gradio inserts the request at its position
        params.append(inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                        annotation=gr.Request))
    wrapped_signature = signature.replace(parameters=params)

    def checked(args, kwargs) -> tuple[tuple, dict]:
        bound = wrapped_signature.bind(*args, **kwargs)
        state, request = bound.arguments.get("state"), bound.arguments.get("request")
        if isinstance(state, BrowserState) and not is_owner(state, request):
            logger.warning("refused %s: the request's login is not the tab's", fn.__name__)
            raise gr.Error(NOT_YOURS)
        if not passes_request:
            bound.arguments.pop("request", None)
        return bound.args, bound.kwargs

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            args, kwargs = checked(args, kwargs)
            yield from fn(*args, **kwargs)
    else:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            args, kwargs = checked(args, kwargs)
            return fn(*args, **kwargs)
    wrapper.__signature__ = wrapped_signature
    # Gradio finds the request parameter by its type hint (typing.get_type_hints, evaluated in this module, where
    # the handler's own string hints would not resolve); the handlers take no other special parameter.
    wrapper.__annotations__ = {"request": gr.Request}
    del wrapper.__wrapped__  # so inspect.signature reads ``__signature__``, not the original's
    return wrapper
