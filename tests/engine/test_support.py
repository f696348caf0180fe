"""The support decision ("the document may not say this") on synthetic attention masses and probabilities, and
the signal on a real SmolLM2 answer."""

from __future__ import annotations

import math

import pytest
import torch

from engine.errors import InputError
from engine.answer.support import (Support, SupportThresholds, claim_logprob, claim_tokens, content_words, decide,
                                   document_share, grounded_share, mean_logprob, page_texts, thresholds_for,
                                   token_logprob)
from engine.types import page_markers


def test_share_counts_the_pages_and_leaves_out_the_sink_and_the_markup_before_them():
    mass = torch.zeros(100, dtype=torch.float64)
    mass[0] = 50.0  # the attention sink: on no page
    mass[6] = 2.0  # the system prompt, before the first page marker
    mass[20:30] = 0.5  # a page: 5.0
    mass[90:] = 0.3  # the question and the answer after the document: 3.0
    share = document_share(mass, (0, 80), [(10, "1"), (40, "2")])
    assert share == pytest.approx(5.0 / 10.0)
    # Without page markers the whole document range (after the sink) counts.
    assert document_share(mass, (0, 80), []) == pytest.approx(7.0 / 10.0)
    assert document_share(torch.zeros(100, dtype=torch.float64), (0, 80), []) is None


@pytest.mark.parametrize("share, logprob, supported", [
    (0.8, -0.1, True),  # looked at the pages, wrote surely
    (0.1, -0.1, False),  # looked at the question and its own words
    (0.8, -2.0, False),  # looked at the pages but wrote unsure (an invented number)
    (0.1, -2.0, False),
    (None, -0.1, True),  # no sources pass: judged on the probabilities alone
    (None, -2.0, False),
    (0.8, None, True),  # an empty answer has no probabilities
])
def test_an_answer_is_flagged_when_either_signal_is_under_its_threshold(share, logprob, supported):
    thresholds = SupportThresholds(min_document_share=0.3, min_mean_logprob=-0.6)
    assert decide(share, logprob, thresholds) == Support(share, logprob, supported)


@pytest.mark.parametrize("grounded, supported", [
    (1.0, True),  # every word of its own is on the pages it looked at
    (0.2, False),  # an invented option or number: on none of them
    (None, True),  # no sources, or no word of its own: not judged on it
])
def test_an_answer_whose_own_words_are_not_on_its_pages_is_flagged(grounded, supported):
    thresholds = SupportThresholds(min_document_share=0.3, min_mean_logprob=-0.6, min_grounded_share=0.5)
    assert decide(0.8, -0.1, thresholds, grounded) == Support(0.8, -0.1, supported, grounded)
    assert decide(0.8, -0.1, SupportThresholds(0.3, -0.6, 0.0), grounded).is_supported  # 0 switches it off


PAGES = """[page 38]
The redirection operator [n]<>word causes the file whose name is the expansion of word to be opened for both
reading and writing on file descriptor n.
[page 39]
Bash handles /dev/udp/host/port: it attempts to open the corresponding UDP socket.
"""


def test_pages_are_split_at_their_markers():
    pages = page_texts(PAGES, page_markers(PAGES))
    assert list(pages) == ["38", "39"]
    assert "<>word" in pages["38"] and "/dev/udp" in pages["39"] and "/dev/udp" not in pages["38"]
    assert page_texts("no markers here", ()) == {"": "no markers here"}


def test_grounded_share_counts_the_answers_own_words_found_on_its_pages():
    pages = page_texts(PAGES, page_markers(PAGES))
    question = "Which operator opens a file for both reading and writing?"
    # Its own words (not the question's, not stopwords): "<>" and "word", both on page 38.
    assert grounded_share("The operator `<>word` opens it.", question, [pages["38"]]) == 1.0
    # An invented operator is on no page; the same answer judged against the wrong page is not grounded either.
    assert grounded_share("Use the `>|` operator.", question, [pages["38"]]) == 0.0
    assert grounded_share("The operator is <>word.", question, [pages["39"]]) == 0.0
    # An invented number among real words: half grounded.
    assert grounded_share("Bash uses a UDP socket on port 7.", "Which port does Bash open?",
                          [pages["39"]]) == pytest.approx(2 / 3)  # udp, socket on the page; 7 not
    # Nothing of its own (it repeats the question) or nothing cited: no signal.
    assert grounded_share("Both reading and writing.", question, [pages["38"]]) is None
    assert content_words("The file is <> and /dev/udp.") == {"<>", "dev/udp"}


def test_claim_tokens_are_the_answers_own_words_not_the_restated_question():
    question = "Which special file name makes Bash open a Unix domain socket?"
    tokens = ["The", " special", " file", " name", " is", " `", "/dev", "/tcp", "/host", "`."]
    assert claim_tokens(tokens, "".join(tokens), question) == [False] * 6 + [True] * 3 + [False]
    # Every token of one of its own words is the claim ("gz", "ip" of "gzip"); stopwords ("uses") never are.
    tokens = ["It", " uses", " gz", "ip", " by", " default", "."]
    assert claim_tokens(tokens, "".join(tokens), "What is the default compression?") == [
        False, False, True, True, False, False, False]
    # An answer that only restates the question has no claim token.
    assert not any(claim_tokens(["Both", " reading"], "Both reading", "Both reading?"))


def test_claim_log_prob_is_the_mean_over_the_answers_own_words_only():
    question = "Which special file name makes Bash open a Unix domain socket?"
    tokens = ["The", " special", " file", " name", " is", " `", "/dev", "/tcp", "/host", "`."]
    # The restated question is written surely (-0.01) over an invented claim written unsure (-0.9, -0.6, -0.3).
    logprobs = [-0.01] * 6 + [-0.9, -0.6, -0.3] + [-0.01]
    assert claim_logprob(tokens, logprobs, question) == pytest.approx(-0.6)
    assert mean_logprob(logprobs) == pytest.approx(-0.187)  # the whole answer's mean hides it
    # An answer that only restates the question is its own claim: every token counts.
    assert claim_logprob(["Both", " reading"], [-0.2, -0.4], "Both reading?") == pytest.approx(-0.3)
    assert claim_logprob([], [], question) is None
    # A token list one longer than the log-probs (a re-tokenized answer) is cut to the log-probs' length.
    assert claim_logprob(tokens + ["!"], logprobs, question) == pytest.approx(-0.6)


def test_the_session_reads_the_claim_off_the_tokens_it_decoded():
    """``DocumentSession`` takes the claim log-prob from the decode itself (its token ids and their log-probs): no
    forward, no re-tokenized text."""
    from types import SimpleNamespace

    from engine.answer.generate import Decoded
    from engine.session import DocumentSession

    pieces = {7: "It", 8: " uses", 9: " gz", 10: "ip", 11: "."}
    session = SimpleNamespace(tokenizer=SimpleNamespace(decode=lambda ids: "".join(pieces[i] for i in ids)))
    end = Decoded("It uses gzip.", 5, None, False, False, (-0.05, -0.05, -1.0, -0.4, -0.05), (7, 8, 9, 10, 11))
    claim = DocumentSession._claim_logprob(session, "What is the default compression?", end)
    assert claim == pytest.approx(-0.7)  # "gz", "ip" only
    assert DocumentSession._claim_logprob(session, "?", Decoded("", 0, None, False, False)) is None


@pytest.mark.parametrize("claim, supported", [(-0.5, True), (-1.5, False), (None, True)])
def test_an_answer_whose_claim_was_written_unsure_is_flagged(claim, supported):
    thresholds = SupportThresholds(min_document_share=0.3, min_mean_logprob=-0.6, min_claim_logprob=-1.0)
    # The share and the whole answer's mean pass; the claim's own tokens decide (a missing one never flags).
    assert decide(0.8, -0.1, thresholds, None, None, claim) == Support(0.8, -0.1, supported, None, None, claim)
    assert decide(0.8, -0.1, SupportThresholds(0.3, -0.6), None, None, -50.0).is_supported  # -100 (default) is off


def test_each_model_gets_its_fitted_thresholds_and_others_the_default_models():
    qwen = thresholds_for("/cache/downloads/qwen2.5-coder-1.5b-instruct.gguf")
    smollm2 = thresholds_for("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert smollm2 == thresholds_for("smollm2-135m.Q4_1.gguf") != qwen
    assert thresholds_for("some/other-model") == qwen  # the CPU default model's
    # Values from the eval set (docs/benchmarks/support.md, judged per answer): the 1.5B looks at the pages (share
    # 0.67 on supported answers against 0.49 on invented ones) and writes its copied answers surely (mean log-prob
    # -0.13 against -0.21): a sure answer looking off the pages is flagged, and so is a very unsure one on them...
    assert decide(0.7, -0.13, qwen).is_supported and not decide(0.7, -0.5, qwen).is_supported
    assert not decide(0.45, -0.05, qwen).is_supported
    # ...while SmolLM2 writes everything unsure (mean log-prob -0.81 supported, -0.90 invented) and is judged on
    # its claim's own tokens alone: an unsure claim is flagged however surely the rest was written or where it looked.
    assert decide(0.8, -0.9, smollm2, None, None, -0.5).is_supported
    assert decide(0.3, -2.0, smollm2, None, None, -0.5).is_supported
    assert not decide(0.9, -0.1, smollm2, None, None, -1.2).is_supported
    # The question's words the document uses are a signal no model ships (min_asked_share 0: off), so a question
    # naming what the document never does is not flagged for it; with a threshold it is.
    assert decide(0.8, -0.9, smollm2, None, None, -0.5, (6 / 7, ("zsh",))).is_supported
    asked = SupportThresholds(min_document_share=0.0, min_mean_logprob=-100.0, min_asked_share=0.858)
    flagged = decide(0.8, -0.9, asked, None, None, -0.5, (6 / 7, ("zsh",)))
    assert not flagged.is_supported and flagged.unknown_words == ("zsh",)  # named: they are why
    assert decide(0.8, -0.9, asked, None, None, -0.5, (1.0, ())).is_supported
    # Flagged for another reason, the unknown words are not named (a common verb a short document lacks is noise).
    assert decide(0.1, -0.9, SupportThresholds(min_document_share=0.3), asked=(6 / 7, ("makes",))).unknown_words == ()
    # The 0.5B is judged on its attention alone (share 0.66 on supported answers, 0.50 on invented ones; its
    # log-probs do not separate them): an answer looking off the pages is flagged however surely it was written.
    small = thresholds_for("/cache/downloads/qwen2.5-coder-0.5b-instruct.gguf")
    assert small not in (qwen, smollm2)
    assert decide(0.7, -2.0, small).is_supported and not decide(0.4, -0.05, small).is_supported


def test_thresholds_are_checked():
    with pytest.raises(InputError):
        SupportThresholds(min_document_share=1.5)
    with pytest.raises(InputError):
        SupportThresholds(min_mean_logprob=0.5)
    with pytest.raises(InputError):
        SupportThresholds(min_grounded_share=-0.1)
    with pytest.raises(InputError):
        SupportThresholds(min_claim_logprob=0.5)
    with pytest.raises(InputError):
        SupportThresholds(min_asked_share=1.5)


def test_the_question_s_words_are_met_in_the_document_through_their_inflections():
    """Real eval questions (benchmarks/data/support_eval.json) against sentences of the Bash manual's pages: a
    question the pages answer uses their words, inflected ("opens" for "open"); a look-alike names another shell."""
    from engine.answer.support import asked_share, document_words, stem

    assert stem("opens") == stem("open") == "open" and stem("allocates") == stem("allocate")
    assert stem("makes") == stem("make") and stem("dev/tcp") == "dev/tcp" and stem("is") == "is"
    page = ("The redirection operator [n]<>word causes the file whose name is the expansion of word to be opened for "
            "both reading and writing on file descriptor n. If the noclobber option to the set builtin has been "
            "enabled, the redirection will fail if the file exists. Redirecting output with > opens the file.")
    words = document_words(page)
    share, unknown = asked_share("Which operator opens a file for both reading and writing?", words)
    assert (share, unknown) == (1.0, ())
    share, unknown = asked_share("Which zsh option makes a '>' redirection fail when the file already exists?", words)
    assert unknown == ("already", "makes", "zsh") and share == pytest.approx(1 - 3 / 7)
    assert asked_share("Which?", words) == (None, ())  # no content word: no signal
    # The session's cache of a document's words is per text (a second call is the same object).
    assert document_words(page) is words


def test_token_logprob_is_the_log_softmax_of_the_chosen_token():
    logits = torch.tensor([2.0, 1.0, 0.0, float("-inf")])
    assert token_logprob(logits, 0) == pytest.approx(2.0 - math.log(math.exp(2) + math.exp(1) + 1))
    assert token_logprob(logits, 3) == -100.0  # a masked token stays finite
    assert mean_logprob([-1.0, -3.0]) == -2.0 and mean_logprob([]) is None


@pytest.mark.slow
def test_a_real_answer_carries_its_support_signal(headinfer_smollm2):
    from benchmarks.quality.niah import paged_haystack
    from engine import DocumentSession, OffloadPolicy

    model, tokenizer = headinfer_smollm2
    document, value, _ = paged_haystack(tokenizer, 800, 0.5, seed=3)
    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=512), answer_budget=64)
    session.set_document(document, pages=page_markers(document))  # the haystack's markers are its own
    session.prefill()
    *streamed, last = session.ask("What is the secret passphrase?", max_new_tokens=16)
    assert all(chunk.support is None for chunk in streamed)  # the final chunk carries it
    support = last.support
    assert support is not None and 0.0 < support.document_share <= 1.0
    assert support.mean_logprob is not None and support.mean_logprob <= 0.0
    assert support.claim_logprob is not None and support.claim_logprob <= 0.0
    assert support.asked_share is not None and 0.0 <= support.asked_share <= 1.0
    assert all(word not in document.lower() for word in support.unknown_words)
    assert support.is_supported == decide(support.document_share, support.mean_logprob,
                                          session.support_thresholds, support.grounded_share,
                                          support.verify_yes, support.claim_logprob,
                                          (support.asked_share, support.unknown_words)).is_supported
    assert session.support_thresholds == thresholds_for("smollm2")  # the model's own fitted thresholds
    # Without sources the probabilities are the same (the same greedy tokens) and the share is absent.
    session.new_conversation()
    *_, plain = session.ask("What is the secret passphrase?", max_new_tokens=16, sources=False)
    assert plain.support.document_share is None and plain.support.grounded_share is None  # both need sources
    assert plain.support.mean_logprob == pytest.approx(support.mean_logprob, abs=1e-5)
    assert plain.support.claim_logprob == pytest.approx(support.claim_logprob, abs=1e-5)
