"""The verification turn ("does the document state the answer?"): its P(yes), and that it leaves the conversation
exactly as it was."""

from __future__ import annotations

import pytest
import torch

from engine.answer.support import Support, SupportThresholds, decide, verify_prompt, yes_share
from engine.answer.support_claim import claim_prompt


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


def test_the_claim_check_names_the_question_and_quotes_the_answer():
    after = claim_prompt("  Which GCC version is needed on macOS? ")
    assert "(Which GCC version is needed on macOS?)" in after and "last answer" in after and "yes or no" in after
    quoted = claim_prompt("Which GCC version is needed on macOS?", "GCC\n  10.3.0.")
    assert "Question: Which GCC version is needed on macOS?" in quoted and "Proposed answer: GCC 10.3.0." in quoted


@pytest.mark.parametrize("verified, supported", [
    (0.9, True),  # the model, asked afterwards, finds the answer stated
    (0.2, False),  # it does not: flagged even though the other signals pass
    (None, True),  # no check ran: not judged on it
])
def test_an_answer_the_model_does_not_find_stated_is_flagged(verified, supported):
    thresholds = SupportThresholds(min_document_share=0.3, min_mean_logprob=-0.6, min_verify_yes=0.5)
    assert decide(0.8, -0.1, thresholds, 1.0, verified) == Support(0.8, -0.1, supported, 1.0, verified)
    assert decide(0.8, -0.1, SupportThresholds(0.3, -0.6), 1.0, 0.2).is_supported  # 0 (the default) is off


def test_the_verify_threshold_is_checked():
    with pytest.raises(ValueError):
        SupportThresholds(min_verify_yes=1.5)


@pytest.mark.slow
def test_the_check_leaves_the_next_answer_unchanged(headinfer_smollm2):
    from benchmarks.quality.niah import paged_haystack
    from engine import DocumentSession, OffloadPolicy

    model, tokenizer = headinfer_smollm2
    document, _, _ = paged_haystack(tokenizer, 600, 0.5, seed=5)
    question = "What is the secret passphrase?"

    def converse(check: bool):
        session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=256), answer_budget=96)
        session.verify_support = check  # the check runs inside ask, before the answer
        session.set_document(document)
        session.prefill()
        *_, first = session.ask(question, max_new_tokens=10, sources=False)
        # The check is not a turn, and the cache holds no token of it.
        assert session.conversation() == [(question, first.text)]
        assert len(session._cached_ids) >= session.document_tokens
        *_, second = session.ask("Which page is it on?", max_new_tokens=10, sources=False)
        return first, second, session

    plain_first, plain_second, _ = converse(check=False)
    first, second, session = converse(check=True)
    assert plain_first.support.verify_yes is None  # off by default for SmolLM2: no check, no cost
    assert 0.0 <= first.support.verify_yes <= 1.0 and session.verify_seconds > 0
    assert (first.text, second.text) == (plain_first.text, plain_second.text)
    assert second.support.mean_logprob == pytest.approx(plain_second.support.mean_logprob, abs=1e-6)
    # The same check asked again later, on the same conversation, reads the same distribution: nothing of it was
    # left in the cache, which goes back to a prefix of what it held. Within fp32 rounding, not to the bit: inside
    # the answer it extended the cache from the end of the first answer (32 tokens), here from the second question's
    # cached prefix (27), so a few positions were computed in chunks of another length (2.4e-6 apart on one CPU; a
    # check token left in the cache would move it by orders of magnitude more).
    cached = list(session._cached_ids)
    yes = session.check_support("Which page is it on?", session.turns[:1])
    assert cached[:len(session._cached_ids)] == session._cached_ids
    assert yes == pytest.approx(second.support.verify_yes, abs=1e-5)
    assert session.check_support("Which page is it on?", session.turns[:1]) == pytest.approx(yes, abs=1e-6)
    # Another yes/no turn in its place (the claim check): its own distribution, the cache again left a prefix.
    claim = session.check_support("Which page is it on?", session.turns[:1], claim_prompt("Which page is it on?"))
    assert 0.0 <= claim <= 1.0 and claim != pytest.approx(yes, abs=1e-6)
    assert cached[:len(session._cached_ids)] == session._cached_ids
    # A fitted rule that uses the check runs it without the opt-in, and flags by it (1.0: any doubt flags).
    session.verify_support = False
    session.support_thresholds = SupportThresholds(0.0, -100.0, 0.0, 1.0)
    *_, third = session.ask("Which page is it on?", max_new_tokens=10, sources=False)
    assert third.support.verify_yes is not None and not third.support.is_supported
