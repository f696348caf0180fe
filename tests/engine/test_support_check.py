"""The verification turn ("does the document state the answer?"): its P(yes), and that it leaves the conversation
exactly as it was."""

from __future__ import annotations

import pytest
import torch

from engine.answer.support import verify_prompt, yes_share


class _Tokenizer:
    """Words to ids: "yes"-like spellings start with id 1, "no"-like ones with 2, anything else 3."""

    def __call__(self, text, add_special_tokens=False):
        word = text.strip().lower()
        return {"input_ids": [{"yes": 1, "no": 2}.get(word, 3)]}


def test_yes_share_weighs_yes_against_no_and_ignores_other_tokens():
    logits = torch.full((5,), -1e9)
    logits[1], logits[2], logits[3] = 0.0, -float(torch.log(torch.tensor(3.0))), 5.0  # p(yes) = 3 p(no)
    assert yes_share(logits, _Tokenizer()) == pytest.approx(0.75)
    logits[1], logits[2] = -1e9, 0.0  # only "no"
    assert yes_share(logits, _Tokenizer()) == pytest.approx(0.0)


def test_the_verification_turn_names_the_question():
    prompt = verify_prompt("  What is the default port?  ")
    assert "What is the default port?" in prompt and "yes or no" in prompt


@pytest.mark.slow
def test_the_check_leaves_the_next_answer_unchanged(headinfer_smollm2):
    from benchmarks.niah import paged_haystack
    from engine import DocumentSession, OffloadPolicy

    model, tokenizer = headinfer_smollm2
    document, _, _ = paged_haystack(tokenizer, 600, 0.5, seed=5)

    def converse(check: bool):
        session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=256), answer_budget=96)
        session.set_document(document)
        session.prefill()
        *_, first = session.ask("What is the secret passphrase?", max_new_tokens=10, sources=False)
        cached = list(session._cached_ids)
        yes = session.check_support("What is the secret passphrase?") if check else None
        # The check is not a turn, and the cache holds no token of it: at most the shared prefix it cropped to.
        assert session.conversation() == [("What is the secret passphrase?", first.text)]
        assert cached[:len(session._cached_ids)] == session._cached_ids
        assert len(session._cached_ids) >= session.document_tokens
        *_, second = session.ask("Which page is it on?", max_new_tokens=10, sources=False)
        return first, second, yes, session

    plain_first, plain_second, _, _ = converse(check=False)
    first, second, yes, session = converse(check=True)
    assert 0.0 <= yes <= 1.0
    assert (first.text, second.text) == (plain_first.text, plain_second.text)
    assert second.support.mean_logprob == pytest.approx(plain_second.support.mean_logprob, abs=1e-6)
    # A second check at the same point reads the same distribution: nothing of the first was left behind.
    assert session.check_support("Which page is it on?") == pytest.approx(session.check_support("Which page is it on?"),
                                                                            abs=1e-6)
