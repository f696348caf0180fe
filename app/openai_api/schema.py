"""The OpenAI wire format: a request's JSON checked into a frozen ``Request`` (or an ``ApiError`` saying what is
wrong, in OpenAI's error shape), and the response bodies and stream chunks built from an answer.

Fields a client sends that this server does not use (``frequency_penalty``, ``user``, ``logit_bias`` …) are ignored,
as front ends send them by default; a field it uses with a wrong type or range is refused with a 400 naming it.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MAX_STOPS = 4  # as OpenAI: at most four stop sequences
MAX_STOP_CHARS = 1000  # a stop's length: the stream's hold-back check costs its length squared at every token
SEEDS = range(-2**63, 2**64)  # what torch's generator takes (2**64 or more overflowed at the front of the line: a 500)


class ApiError(Exception):
    """A request refused, with the HTTP status and OpenAI's error fields."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.param = status, message, kind, code, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "code": self.code, "param": self.param}}


@dataclass(frozen=True)
class Request:
    """One completion request, checked. ``messages``: (role, text) pairs for a chat; ``prompt``: the text of a
    ``/v1/completions`` request (then ``messages`` is empty)."""

    model: str
    messages: tuple[tuple[str, str], ...] = ()
    prompt: str | None = None
    max_tokens: int | None = None  # None: what the context leaves, at most the session's longest answer
    temperature: float = 1.0  # OpenAI's default
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def question(self) -> str:
        """The text the answer's support check weighs: the last user message (or the prompt's end)."""
        users = [text for role, text in self.messages if role == "user"]
        return users[-1] if users else (self.prompt or "")[-2000:]


def parse_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"The body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:  # a text/plain body is not screened by app.request_body: before, a 500
        raise ApiError(400, "The body's JSON is nested too deeply.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The body must be a JSON object.", code="invalid_json")
    return body


def chat_request(body: dict) -> Request:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty array of {role, content} objects.", param="messages")
    return Request(model=_model(body), messages=tuple(_message(m, i) for i, m in enumerate(messages)),
                   **_sampling(body))


def completion_request(body: dict) -> Request:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "'prompt' must be a non-empty string (one prompt a request).", param="prompt")
    return Request(model=_model(body), prompt=prompt, **_sampling(body))


def _model(body: dict) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' must be a string: one of GET /v1/models' ids.", param="model")
    return model


def _message(message, index: int) -> tuple[str, str]:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise ApiError(400, f"'{where}' must be an object with 'role' and 'content'.", param=where)
    role = ROLES.get(message.get("role"))
    if role is None:
        raise ApiError(400, f"'{where}.role' must be one of system, developer, user, assistant "
                            f"(not {message.get('role')!r}).", param=f"{where}.role")
    content = message.get("content")
    if isinstance(content, list):  # typed parts: only text is taken
        if not all(isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
                   for part in content):
            raise ApiError(400, f"'{where}.content' parts must be text parts ({{type: text, text}}); this server "
                                "reads text only.", param=f"{where}.content")
        content = "".join(part["text"] for part in content)
    if content is None and role == "assistant":
        content = ""
    if not isinstance(content, str):
        raise ApiError(400, f"'{where}.content' must be a string or an array of text parts.", param=f"{where}.content")
    return role, content


def _sampling(body: dict) -> dict:
    if body.get("n", 1) != 1:
        raise ApiError(400, "'n' must be 1: one answer a request.", param="n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise ApiError(400, "'max_tokens' must be a whole number of at least 1.", param="max_tokens")
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0:
        raise ApiError(400, "'top_p' must be more than 0.", param="top_p")
    stop = body.get("stop")
    stops = () if stop is None else (stop,) if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)) or len(stops) > MAX_STOPS or \
            not all(isinstance(text, str) and 0 < len(text) <= MAX_STOP_CHARS for text in stops):
        raise ApiError(400, f"'stop' must be a non-empty string of at most {MAX_STOP_CHARS:,} characters or an "
                            f"array of at most {MAX_STOPS} of them.", param="stop")
    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or seed not in SEEDS):
        raise ApiError(400, "'seed' must be a whole number from -2**63 to 2**64 - 1.", param="seed")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false.", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise ApiError(400, "'stream_options' must be an object like {\"include_usage\": true}.",
                       param="stream_options")
    return {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "stop": tuple(stops),
            "seed": seed, "stream": stream, "include_usage": bool(options.get("include_usage", False))}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
            not low <= value <= high:
        raise ApiError(400, f"'{name}' must be a number from {low:g} to {high:g}.", param=name)
    return float(value)


# -- responses --------------------------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response(request: Request, ident: str, text: str, finish: str, counts: dict, extra: dict) -> dict:
    """The whole (non-streamed) body: ``chat.completion`` or ``text_completion``."""
    if request.prompt is not None:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        kind = "text_completion"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish}
        kind = "chat.completion"
    return {"id": ident, "object": kind, "created": request.created, "model": request.model, "choices": [choice],
            "usage": counts, "headinfer": extra}


def chunk(request: Request, ident: str, text: str | None, finish: str | None = None, *, first: bool = False,
          counts: dict | None = None, extra: dict | None = None, no_choice: bool = False) -> dict:
    """One stream chunk; ``no_choice``: OpenAI's last, usage-only chunk (``stream_options.include_usage``)."""
    if request.prompt is not None:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        kind = "text_completion"
    else:
        delta = {"role": "assistant", "content": text or ""} if first else {} if text is None else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        kind = "chat.completion.chunk"
    body = {"id": ident, "object": kind, "created": request.created, "model": request.model,
            "choices": [] if no_choice else [choice]}
    if counts is not None:
        body["usage"] = counts
    if extra is not None:
        body["headinfer"] = extra
    return body
