"""The prompt builder's ids for a model without a chat template (a base model's plain transcript)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from engine.prompt import PromptBuilder, Turn

WORDS = ["<bos>", "<unk>", "System:", "User:", "Assistant:", "Question:", "the", "manual", "says", "what", "yes"]


def base_tokenizer(add_bos_token: bool) -> PreTrainedTokenizerFast:
    raw = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<bos>", unk_token="<unk>",
                                        add_bos_token=add_bos_token)
    assert not tokenizer.chat_template
    return tokenizer


@pytest.mark.parametrize("add_bos_token", [True, False])
def test_a_transcript_starts_with_bos_when_the_tokenizer_adds_one(add_bos_token):
    tokenizer = base_tokenizer(add_bos_token)
    prompts = PromptBuilder(tokenizer, system_prompt="")
    document = "the manual says"
    # What the tokenizer itself makes of the whole transcript, as stock transformers would feed it.
    transcript = f"User: {document}\n\nQuestion: what\n\nAssistant:"
    expected = tokenizer(transcript)["input_ids"]
    assert (expected[0] == tokenizer.bos_token_id) == add_bos_token
    ids = prompts.document_ids(document) + prompts.conversation_ids(document, [], "what")
    assert ids == expected
    tokens = prompts.tokenize_document(document)
    assert tokens.ids == prompts.document_ids(document)
    assert tokens.count_between(0, len(document)) == 3  # the <bos> is markup, not the document's own
    # Later turns continue the transcript: no second <bos>.
    follow_up = prompts.conversation_ids(document, [Turn("what", "yes")], "what")
    assert tokenizer.bos_token_id not in follow_up
