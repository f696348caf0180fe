"""``--backend``'s client and session against a real OpenAI-compatible server running here (``transformers serve`` on
the embedded SmolLM2, offline): the model list, a read counted by the backend's own tokenizer, a streamed answer with
its TTFT / tokens / tok/s, a follow-up that sends the conversation, a stop, and the errors."""

from __future__ import annotations

import pytest
from backend_server import transformers_serve
from transformers import AutoTokenizer

from app.backend_client import BackendClient, BackendError
from app.backend_session import RemoteSession
from engine.models.loader import embedded_model_dir

pytestmark = pytest.mark.slow

DOCUMENT = "=== lighthouse.txt ===\nThe lighthouse keeper's secret code is ORCHID-7. The lamp is lit at dusk."


@pytest.fixture(scope="module")
def backend():
    with transformers_serve(embedded_model_dir()) as (url, model):
        client = BackendClient(url)
        yield client, model
        client.close()


def test_models_read_and_streamed_answers(backend):
    client, model = backend
    assert model in [m.id for m in client.models()]  # GET /v1/models names the served folder
    session = RemoteSession(client, model)
    assert not session.is_prefilled
    read = session.read(DOCUMENT)
    # The backend's count is its tokenizer's over the chat template, generation prompt included: not a guess.
    tokenizer = AutoTokenizer.from_pretrained(model)
    expected = len(tokenizer.apply_chat_template(session.prefix(), add_generation_prompt=True, tokenize=True,
                                                 return_dict=False))
    assert read.tokens == session.document_tokens == expected
    assert session.is_prefilled

    chunks = list(session.ask("What is the secret code?", max_new_tokens=6, temperature=0.0))
    last = chunks[-1]
    assert last.done and not last.stopped and all(not c.done for c in chunks[:-1])
    assert len(chunks) >= 3  # streamed piece by piece, not in one reply
    assert [c.text for c in chunks[:-1]] == sorted((c.text for c in chunks[:-1]), key=len)  # each the one before + more
    assert last.text and last.num_tokens == 6  # the backend's usage: cut at max_tokens
    assert last.ttft is not None and last.ttft > 0 and last.tokens_per_second > 0
    assert last.prompt_tokens > read.tokens  # the document's prompt plus the question
    assert session.turns == [("What is the secret code?", last.text)]

    # A follow-up sends the earlier turn after the same document start (the prefix the backend's cache reuses).
    follow = list(session.ask("And when is the lamp lit?", max_new_tokens=2, temperature=0.0))[-1]
    assert follow.prompt_tokens > last.prompt_tokens + last.num_tokens
    # Stopped after its first piece: marked stopped and kept out of the conversation.
    calls = iter(range(1_000))  # the stream's lines read: a role event, a blank line, the first word...
    stopped = list(session.ask("Say more.", max_new_tokens=50, temperature=0.0,
                               should_stop=lambda: next(calls) >= 5))[-1]
    assert stopped.stopped and 0 < stopped.num_tokens < 50 and len(session.turns) == 2
    session.new_conversation()
    assert session.turns == [] and session.is_prefilled


def test_errors_say_what(backend):
    client, _ = backend
    with pytest.raises(BackendError, match=r"refused \(4\d\d\)"):
        list(RemoteSession(client, "no-such/model").ask("hi", max_new_tokens=2, temperature=0.0))
    gone = BackendClient("http://127.0.0.1:9")  # the discard port: nothing listens
    with pytest.raises(BackendError, match="could not be reached"):
        gone.models()
