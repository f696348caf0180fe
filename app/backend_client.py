"""A client for an OpenAI-compatible engine the owner runs elsewhere (``launch.py --backend URL``: vLLM or SGLang on
a multi-GPU server, a llama.cpp server, ``transformers serve``), for models and contexts one PC cannot hold.

Torch-free and small: ``GET /v1/models`` for the model list, ``POST /v1/chat/completions`` streamed as server-sent
events for answers, and the same request with one answer token for a read (the engine tokenizes and prefills the
document, its prefix cache keeps it for the questions after, and its ``usage`` gives the exact token count). The key
comes from a file or ``HEADINFER_BACKEND_KEY``, never the command line (a key there shows in ``ps``).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

logger = logging.getLogger(__name__)

ENV_VAR = "HEADINFER_BACKEND_KEY"


class BackendError(RuntimeError):
    """The backend refused, failed or could not be reached; the message says which, never the key."""


def read_backend_key(path: str | None, environ: dict[str, str] | None = None) -> str | None:
    """The key from ``path``'s first line or, without one, ``HEADINFER_BACKEND_KEY``; None when neither is set."""
    if path is not None:
        file = Path(path).expanduser()
        if not file.is_file():
            raise BackendError(f"--backend-key-file takes a file holding the key, and {path!r} is no file")
        lines = file.read_text(encoding="utf-8").splitlines()
        key = lines[0].strip() if lines else ""
        if not key:
            raise BackendError(f"the backend key file {path!r} is empty")
        return key
    return (os.environ if environ is None else environ).get(ENV_VAR, "").strip() or None


@dataclass(frozen=True)
class Delta:
    """One streamed piece of an answer: its text, and on the last piece the usage counts (None: not given)."""

    text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None


@dataclass(frozen=True)
class BackendModel:
    """A model the backend serves, and its window where the backend says it (vLLM's ``max_model_len``)."""

    id: str
    max_model_len: int | None = None


class BackendClient:
    """One OpenAI-compatible server, at ``url`` (``http://host:8000`` or ``…/v1``)."""

    def __init__(self, url: str, key: str | None = None, timeout: float = 600.0,
                 transport: httpx.BaseTransport | None = None):
        """``transport``: httpx's (a test's in-process server); None: the network."""
        base = url.rstrip("/")
        self.base = base if base.endswith("/v1") else base + "/v1"
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        # No redirects followed: the page talks to the owner's URL only, never where a reply points it.
        self._http = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout, connect=10.0), transport=transport,
                                  follow_redirects=False)

    @property
    def where(self) -> str:
        """The server's address as the page shows it (no key, no path past /v1)."""
        return self.base

    def models(self) -> list[BackendModel]:
        """The backend's models (``GET /v1/models``)."""
        body = self._json(self._request("GET", "/models"))
        found = [BackendModel(str(item["id"]), _int_or_none(item.get("max_model_len")))
                 for item in body.get("data", []) if isinstance(item, dict) and "id" in item]
        if not found:
            raise BackendError(f"{self.base}/models lists no models")
        return found

    def count_prompt(self, model: str, messages: list[dict]) -> int:
        """The prompt's tokens as the backend counts them, by asking for one answer token: the backend reads the
        prompt (its prefix cache keeps it for the next request with the same start)."""
        body = self._json(self._request("POST", "/chat/completions", json={
            "model": model, "messages": messages, "max_tokens": 1, "temperature": 0.0, "stream": False}))
        tokens = _int_or_none((body.get("usage") or {}).get("prompt_tokens"))
        if tokens is None:
            raise BackendError("the backend's reply has no usage.prompt_tokens")
        return tokens

    def stream_chat(self, model: str, messages: list[dict], *, max_tokens: int, temperature: float,
                    should_stop: Callable[[], bool] = lambda: False) -> Iterator[Delta]:
        """The answer as it streams (server-sent events); closing the stream early (``should_stop``) ends the
        request, which the backend takes as the client leaving."""
        payload = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": temperature,
                   "stream": True, "stream_options": {"include_usage": True}}
        try:
            with self._http.stream("POST", self.base + "/chat/completions", json=payload) as response:
                if response.status_code >= 400:
                    response.read()
                    raise BackendError(_refusal(response))
                for line in response.iter_lines():
                    if should_stop():
                        return
                    delta = _event(line)
                    if delta is not None:
                        yield delta
        except httpx.HTTPError as exc:
            raise BackendError(f"the backend at {self.base} failed: {type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs) -> httpx.Response:
        try:
            response = self._http.request(method, self.base + path, **kwargs)
        except httpx.HTTPError as exc:
            raise BackendError(f"the backend at {self.base} could not be reached: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise BackendError(_refusal(response))
        return response

    @staticmethod
    def _json(response: httpx.Response) -> dict:
        try:
            body = response.json()
        except ValueError as exc:
            raise BackendError(f"the backend's reply is not JSON ({response.status_code})") from exc
        if not isinstance(body, dict):
            raise BackendError("the backend's reply is not a JSON object")
        return body


def _event(line: str) -> Delta | None:
    """One ``data: {...}`` line of the stream as a ``Delta`` (None: a comment, keep-alive or ``[DONE]``)."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    try:
        chunk = json.loads(data)
    except ValueError:
        logger.warning("the backend sent an event that is not JSON; skipped")
        return None
    if not isinstance(chunk, dict):
        logger.warning("the backend sent an event that is not a JSON object; skipped")
        return None
    if chunk.get("error") is not None:  # vLLM and SGLang report a failure mid-stream as an event
        raise BackendError(f"the backend failed while answering: {_message(chunk)}")
    choices = chunk.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    text = (choice.get("delta") or {}).get("content") or ""
    usage = chunk.get("usage") or {}
    return Delta(str(text), _int_or_none(usage.get("prompt_tokens")), _int_or_none(usage.get("completion_tokens")),
                 choice.get("finish_reason"))


def _refusal(response: httpx.Response) -> str:
    """The backend's error, said briefly: its status and its own message where it gave one; an HTML error page (a
    proxy's 502) by its title, never its markup."""
    try:
        message = _message(response.json())
    except ValueError:
        message = response.text
        if "html" in response.headers.get("content-type", "").lower() or _TAG.search(message):
            title = _TITLE.search(message)
            message = (f"an error page ({_plain(title.group(1))})" if title and _plain(title.group(1))
                       else f"an error page ({_plain(_HIDDEN.sub(' ', message)) or 'no text'})")
    return f"the backend refused ({response.status_code}): {_plain(message) or 'no reason given'}"


_TAG = re.compile(r"<[a-zA-Z!/][^>]*>")
_HIDDEN = re.compile(r"<(script|style)\b.*?</\1\s*>", re.IGNORECASE | re.DOTALL)  # what a page never shows
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
MESSAGE_CHARS = 300  # a backend's message is cut here: it may echo a whole prompt


def _message(body) -> str:
    """The ``error.message`` of an OpenAI-shaped error body (or whatever the body is)."""
    detail = body.get("error", body) if isinstance(body, dict) else body
    return str(detail.get("message", detail) if isinstance(detail, dict) else detail)


def _plain(text: str) -> str:
    """``text`` as one short plain line: tags and control characters out, spaces collapsed, cut to its limit."""
    line = " ".join(_CONTROL.sub(" ", _TAG.sub(" ", text)).split())
    return line if len(line) <= MESSAGE_CHARS else line[:MESSAGE_CHARS] + "…"


def _int_or_none(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
