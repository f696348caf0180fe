"""Parity on the real embedded model (SmolLM2-135M-Instruct, CPU, fp32): stock vs head-wise."""

from __future__ import annotations

import pytest
import torch
from machine_load import load, stretched
from smollm2_runs import NEW_TOKENS, real_text, stock_greedy

import engine
from engine import DocumentSession, OffloadPolicy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_and_tokenizer(smollm2):
    model, tokenizer = smollm2
    yield model, tokenizer
    model.set_attn_implementation("sdpa")


@torch.inference_mode()
def test_2k_prompt_greedy_tokens_identical(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    ids = tokenizer(real_text(), add_special_tokens=False)["input_ids"][:2048]
    expected = stock_greedy(model, ids)
    expected_logits = model(torch.tensor([ids]), logits_to_keep=1).logits[0, -1]

    model.set_attn_implementation("headinfer")
    for resident_slots in (None, 0):  # zero-copy homes, and the ping-pong fetch path
        cache = engine.HeadInferCache(model.config, chunk_size=500, resident_slots=resident_slots, head_group_size=1)
        out = model.generate(torch.tensor([ids]), past_key_values=cache, prefill_chunk_size=500,
                             max_new_tokens=NEW_TOKENS, do_sample=False)
        assert out[0, len(ids):].tolist() == expected
        cache.crop_to(len(ids) - 1)
        logits = model(torch.tensor([ids[-1:]]), past_key_values=cache, use_cache=True).logits[0, -1]
        assert float((logits - expected_logits).abs().max() / expected_logits.abs().max()) < 1e-5


@torch.inference_mode()
def test_session_answers_match_stock_after_crop_and_reuse(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    document = real_text()[:6000]
    question = "Which module wraps and fills text?"
    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=512), answer_budget=256)
    doc_tokens = session.set_document(document)
    ids = session.prompts.document_ids(document) + session.prompts.conversation_ids(document, [], question)
    expected = tokenizer.decode(stock_greedy(model, ids), skip_special_tokens=True)

    model.set_attn_implementation("headinfer")
    progress = []
    session.prefill(on_progress=progress.append)
    assert session.is_prefilled and progress[-1].tokens_done == doc_tokens and len(progress) >= 2
    first = list(session.ask(question, max_new_tokens=NEW_TOKENS, repetition_guard=None))  # exact greedy
    assert first[-1].done and first[-1].text.strip() == expected.strip()
    assert len(first) > 2 and first[0].ttft is not None

    # A follow-up sees the first turn; a new conversation crops back to the document, never re-reading it.
    follow_up = list(session.ask("Say that again in one word.", max_new_tokens=8))
    assert follow_up[-1].done and session.memory()["context_tokens"] > doc_tokens
    session.new_conversation()
    assert session.cache.get_seq_length() == doc_tokens and session.is_prefilled
    again = list(session.ask(question, max_new_tokens=NEW_TOKENS, repetition_guard=None))
    assert again[-1].text == first[-1].text


def test_document_limits_truncation_and_refusal_keep_the_previous_document(model_and_tokenizer):
    from engine import PlanError

    model, tokenizer = model_and_tokenizer
    text = real_text()
    session = DocumentSession(model, tokenizer, OffloadPolicy(max_context=1000), answer_budget=200)
    short = session.set_document("A short note about tides.")
    with pytest.raises(PlanError, match="at most 800 fit"):
        session.set_document(text)
    assert session.document_tokens == short  # the refusal lost nothing
    kept = session.set_document(text, truncate_to_fit=True)
    assert 700 < kept <= 800 and session.document.startswith(text[:200]) and "truncated" in session.document
    assert session.cache.plan.fits
    plan = session.document_plan()  # the plan of what was kept, without tokenizing it again
    assert plan.context_tokens == kept + 200 and plan == session.plan(session.document)
    with pytest.raises(ValueError, match="empty"):
        session.set_document("   \n ")


def test_the_models_trained_window_bounds_a_document(model_and_tokenizer):
    from engine import PlanError

    model, tokenizer = model_and_tokenizer
    session = DocumentSession(model, tokenizer, OffloadPolicy())  # memory alone would allow ~400K tokens
    tokens = session.tokenize((real_text() + "\n\n") * 6)
    assert len(tokens) > 10_000
    plan = session.plan(tokens)
    assert plan.fits and plan.max_context_tokens > 100_000  # memory is not what binds
    assert (plan.context_limit, plan.limited_by, plan.is_within_limit) == (8192, "model", False)
    assert "reads at most 8,192 tokens" in plan.limit_reason and "long-context model" in plan.limit_reason
    with pytest.raises(PlanError, match="reads at most 8,192 tokens"):
        session.set_document(tokens)
    kept = session.set_document(tokens, truncate_to_fit=True)
    assert 8192 - session.answer_budget - 64 < kept <= 8192 - session.answer_budget
    assert session.max_context <= 8192 and "truncated" in session.document

    lifted = DocumentSession(model, tokenizer, OffloadPolicy(exceed_trained_window=True))
    assert lifted.plan(tokens).is_within_limit and lifted.plan(tokens).limited_by == "memory"


# -- cancel -----------------------------------------------------------------------------------------
def test_cancel_lands_inside_a_chunk_and_the_read_resumes_exactly(model_and_tokenizer):
    from engine import PrefillCancelled

    model, tokenizer = model_and_tokenizer
    model.set_attn_implementation("headinfer")
    text = real_text()[:2500]
    question = "Which module wraps text?"
    reference = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=256))
    reference.set_document(text)
    reference.prefill()
    expected = list(reference.ask(question, max_new_tokens=8))[-1].text

    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=256))
    session.set_document(text)
    assert session.document_tokens > 2 * 256
    calls = []

    def stop_at(call: int):
        calls.clear()
        return lambda: calls.append(1) or len(calls) >= call

    with pytest.raises(PrefillCancelled):
        session.prefill(should_stop=stop_at(4))  # the check before the chunk, then layer 0, its attention, its MLP
    assert session.prefilled_tokens == 0 == session.cache.get_seq_length()  # without layer checks: 768
    with pytest.raises(PrefillCancelled):
        session.prefill(should_stop=stop_at(100))  # the second chunk, a few layers in
    assert session.prefilled_tokens == 256 == session.cache.get_seq_length()  # cropped back to the boundary
    session.prefill()
    assert session.is_prefilled
    assert list(session.ask(question, max_new_tokens=8))[-1].text == expected


def _filled_to(session: DocumentSession, num_tokens: int) -> None:
    """The cache at ``num_tokens`` tokens of the document, as if read, in about a second instead of a minute: random
    K/V appended through the cache's own ``update`` (its state is the same; only the values differ, and a cancel's
    timing does not depend on them), and the session told which of the document's tokens the cache holds."""
    config, generator = session.model.config, torch.Generator().manual_seed(0)
    step = session.policy.chunk_size
    with torch.inference_mode():
        for start in range(0, num_tokens, step):
            shape = (1, config.num_key_value_heads, min(step, num_tokens - start), config.head_dim)
            for layer in range(config.num_hidden_layers):
                session.cache.update(torch.randn(shape, generator=generator),
                                     torch.randn(shape, generator=generator), layer)
    session._cached_ids.extend(session._document_ids[:num_tokens])
    assert session.prefilled_tokens == session.cache.get_seq_length() == num_tokens


def test_cancel_takes_effect_within_a_second_at_the_8k_position(model_and_tokenizer):
    import threading
    import time

    from engine import PrefillCancelled

    model, tokenizer = model_and_tokenizer
    model.set_attn_implementation("headinfer")
    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=4096, exceed_trained_window=True))
    session.set_document((real_text() + "\n\n") * 5)
    _filled_to(session, 8192)
    flags = {"stop": False}
    ended: list[float] = []

    def read() -> None:
        try:
            session.prefill(should_stop=lambda: flags["stop"])
        except PrefillCancelled:
            ended.append(time.perf_counter())

    latencies = []
    for pause in (0.0, 0.4, 1.1):
        flags["stop"], ended[:] = False, []
        worker = threading.Thread(target=read)
        worker.start()
        time.sleep(0.2 + pause)  # somewhere inside the 4K-token forward that follows the 8K position
        flags["stop"], asked = True, time.perf_counter()
        worker.join(timeout=60)
        latencies.append(ended[0] - asked)
        assert session.prefilled_tokens == session.cache.get_seq_length() == 8192  # the chunk cropped off: resumable
    # Before: the rest of the 4K-token chunk, 27.6 s on a laptop CPU. Now one layer's forward at most: 0.5-0.9 s
    # here alone, 2.4 s once in CI while the other worker ran a browser test on the same 2 cores.
    # 3.27 s once in a full run at load 10 on the 2 cores: stretched by the oversubscription.
    assert max(latencies) < stretched(3.0), (latencies, load())
