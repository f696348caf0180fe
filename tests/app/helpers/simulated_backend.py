"""An OpenAI-compatible server's answers in-process (an httpx transport's handler) for the --backend page's tests: the
backend is not what they test (tests/app/test_backend.py runs a real one)."""

from __future__ import annotations

import json
import threading

import httpx


class SimulatedBackend:
    """An OpenAI-compatible server's answers: ``/v1/models``, a whole chat (its usage) and a streamed one, which
    waits at its first word while ``hold`` is clear; counts the chats running at once."""

    def __init__(self):
        self.hold, self.lock = threading.Event(), threading.Lock()
        self.hold.set()
        self.running = self.most_running = 0
        self.chats: list[dict] = []
        self.failure: httpx.Response | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "team/model", "max_model_len": 32768}]})
        if self.failure is not None:
            return self.failure
        body = json.loads(request.content)
        self.chats.append(body)
        prompt = sum(len(m["content"]) for m in body["messages"]) // 4
        if not body.get("stream"):
            return httpx.Response(200, json={"choices": [{"message": {"content": "."}}],
                                             "usage": {"prompt_tokens": prompt, "completion_tokens": 1}})
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=self._stream(prompt))

    def _stream(self, prompt: int):
        with self.lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            for word in ("The ", "code ", "is ", "ORCHID-7."):
                yield f'data: {json.dumps({"choices": [{"delta": {"content": word}}]})}\n\n'.encode()
                self.hold.wait(10)
            usage = {"prompt_tokens": prompt, "completion_tokens": 4}
            yield f'data: {json.dumps({"choices": [{"delta": {}, "finish_reason": "stop"}], "usage": usage})}\n\n'.encode()
            yield b"data: [DONE]\n\n"
        finally:
            with self.lock:
                self.running -= 1
