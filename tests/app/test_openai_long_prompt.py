"""A prompt far past the context is refused by its length before it is tokenized, as the page's questions are
(``app.questions.CHARS_PER_TOKEN``): before, the API tokenized whatever its 64 MiB body held (a 30 MB prompt: two
minutes of CPU, eight such requests at once, beside the page's reads) only to say 400."""

from __future__ import annotations

import pytest

from app.openai_api.completions import Completions
from app.openai_api.library import Library
from app.openai_api.schema import ApiError, completion_request
from app.questions import CHARS_PER_TOKEN
from app.ui import build_ui
from engine import DocumentSession, OffloadPolicy
from engine.models.loader import describe


@pytest.fixture(scope="module")
def completions(embedded_model):
    """The API's completions over the studio's state, recording the length of every text it tokenizes."""
    model, tokenizer = embedded_model
    demo = build_ui(lambda: DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=32)), model_info=describe(model))
    library = Library(demo.studio_state, private=True)
    completions = Completions(demo.studio_state, library)
    tokenized, ids = [], completions.ids

    def recording(text: str) -> list[int]:
        tokenized.append(len(text))
        return ids(text)

    completions.ids, completions.tokenized = recording, tokenized
    return completions


def test_a_prompt_far_past_the_context_is_refused_untokenized(completions):
    context = completions.library.own_session().limits().context_limit
    prompt = "word " * (CHARS_PER_TOKEN * context)  # past 4 x 8 characters a token of the context
    completions.tokenized.clear()
    with pytest.raises(ApiError) as refused:
        completions.check(completion_request({"model": "m", "prompt": prompt, "max_tokens": 1}))
    assert refused.value.status == 400 and refused.value.code == "context_length_exceeded"
    assert f"{len(prompt):,} characters" in str(refused.value)
    assert not completions.tokenized  # before: all of it, to count its tokens


def test_a_prompt_near_the_context_is_still_counted_in_tokens(completions):
    context = completions.library.own_session().limits().context_limit
    prompt = "word " * (context + 10)  # just past the context: the exact token numbers, not a character cap
    completions.tokenized.clear()
    with pytest.raises(ApiError) as refused:
        completions.check(completion_request({"model": "m", "prompt": prompt, "max_tokens": 1}))
    assert refused.value.code == "context_length_exceeded" and "tokens" in str(refused.value)
    assert completions.tokenized == [len(prompt)]
    fits = completions.check(completion_request({"model": "m", "prompt": "Say hi.", "max_tokens": 4}))
    assert fits.prompt_tokens > 0 and fits.max_tokens == 4
