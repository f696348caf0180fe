"""The prompt builder's ids: a base model's plain transcript, and the layout where every question is a user
message of its own (a fresh chat's question reads as a later one's)."""

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
    prompts = PromptBuilder(tokenizer, system_prompt="", question_turn=False)
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


def test_in_a_transcript_the_question_is_its_own_turn_after_the_document():
    tokenizer = base_tokenizer(True)
    prompts = PromptBuilder(tokenizer, system_prompt="", question_turn=True)
    document = "the manual says"
    transcript = f"User: {document}\n\nUser: what\n\nAssistant:"
    assert prompts.document_ids(document) + prompts.conversation_ids(document, [], "what") == \
        tokenizer(transcript)["input_ids"]


ALTERNATING = ("{% for m in messages %}{% if m['role'] == 'user' and loop.index0 > 0 and "
               "messages[loop.index0 - 1]['role'] == 'user' %}{{ raise_exception('roles must alternate') }}"
               "{% endif %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
               "{% if add_generation_prompt %}assistant:{% endif %}")


def test_a_template_that_needs_alternating_roles_keeps_the_question_in_the_document_message():
    tokenizer = base_tokenizer(False)
    tokenizer.chat_template = ALTERNATING
    prompts = PromptBuilder(tokenizer, system_prompt="", question_turn=True)
    assert not prompts.question_turn
    ids = prompts.conversation_ids("the manual says", [Turn("what", "yes")], "what")  # renders, no raise
    assert ids


@pytest.fixture(scope="module")
def chat_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def test_a_fresh_question_reads_as_the_same_turn_a_later_question_does(chat_tokenizer):
    prompts = PromptBuilder(chat_tokenizer, question_turn=True)
    assert prompts.question_turn
    document = "[page 1]\nThe default port is 8080."
    prefix = prompts.document_text(document)
    assert "Which port?" not in prefix and prefix.rstrip().endswith(chat_tokenizer.decode(
        chat_tokenizer("<|im_start|>user", add_special_tokens=False)["input_ids"]))
    fresh = prompts.conversation_ids(document, [], "Which port?")
    later = prompts.conversation_ids(document, [Turn("What is it?", "A server.")], "Which port?")
    # The same question turn ends both: a fresh chat differs only by not having the earlier turn before it.
    assert later[-len(fresh):] == fresh and len(later) > len(fresh)
    # The prefix holds for every conversation, and a glued builder's prefix differs (old snapshots do not match).
    assert prompts.document_ids(document) == PromptBuilder(chat_tokenizer, question_turn=True).document_ids(document)
    assert PromptBuilder(chat_tokenizer, question_turn=False).document_ids(document) != prompts.document_ids(document)
    tokens = prompts.tokenize_document(document)
    assert tokens.ids == prompts.document_ids(document) and tokens.count_between(0, len(document)) > 0
