"""The plan panel names what 8-bit KV or a disk tier would reach when memory is what binds."""

from transformers import LlamaConfig

from app import render
from engine.planning.capacity import capacity_options
from engine.planning.planner import make_plan
from engine.planning.shape import ModelShape
from engine.planning.policy import OffloadPolicy

GIB = 1 << 30


def test_reaches_tile_lists_the_options_and_lossy_kv_is_labelled(tmp_path):
    shape = ModelShape.from_config(LlamaConfig(num_hidden_layers=32, num_key_value_heads=8, head_dim=128,
                                               num_attention_heads=32, hidden_size=4096,
                                               max_position_embeddings=1 << 23), dtype_bytes=2)
    plan = make_plan(shape, OffloadPolicy(), 1 << 20, device_is_cuda=True, gpu_budget=24 * GIB, host_budget=32 * GIB)
    assert plan.limited_by == "memory"
    options = capacity_options(shape, OffloadPolicy(disk_dir=str(tmp_path)), device_is_cuda=True,
                               gpu_budget=24 * GIB, host_budget=32 * GIB)
    html = render.plan_panel(plan, 1000, 10.0, "int8", options)
    assert "Reaches" in html and "RAM + 8-bit (lossy)" in html and "RAM + disk" in html
    assert "int8, lossy" in html  # KV storage named as lossy wherever it is on
    assert "Reaches" not in render.plan_panel(plan, 1000, 10.0)


def test_the_head_group_tile_says_how_many_streamed_groups_one_copy_fetches():
    import dataclasses

    shape = ModelShape.from_config(LlamaConfig(num_hidden_layers=32, num_key_value_heads=8, head_dim=128,
                                               num_attention_heads=32, hidden_size=4096,
                                               max_position_embeddings=1 << 20), dtype_bytes=2)
    # 320K tokens on a 24 GiB GPU: 77 of 256 slots resident, so runs of up to 3 adjacent groups stream per layer.
    plan = make_plan(shape, OffloadPolicy(head_group_size=1, groups_per_buffer=4), 320 * 1024, device_is_cuda=True,
                     gpu_budget=24 * GIB, host_budget=128 * GIB)
    assert plan.groups_per_buffer == 3
    assert "8 groups/layer · 3 fetched per copy" in render.plan_panel(plan, 1000, 10.0)
    assert "fetched per copy" not in render.plan_panel(dataclasses.replace(plan, groups_per_buffer=1), 1000, 10.0)


def test_a_truncated_read_shows_the_plan_of_what_was_read():
    shape = ModelShape.from_config(LlamaConfig(num_hidden_layers=2, num_key_value_heads=2, head_dim=16,
                                               num_attention_heads=4, hidden_size=64,
                                               max_position_embeddings=8192), dtype_bytes=4)
    plan = make_plan(shape, OffloadPolicy(), 7_000 + 1024, device_is_cuda=False, gpu_budget=None,
                     host_budget=32 * GIB)
    html = render.plan_panel(plan, 7_000, 30.0, truncated_from=20_000)
    assert 'data-fits="true"' in html and 'data-tokens="7000"' in html and 'data-truncated-from="20000"' in html
    assert "Read the first 7,000 tokens of 20,000" in html and "truncated to fit" in html
    assert "Too long" not in html and "truncated" not in render.plan_panel(plan, 7_000, 30.0).lower()


def test_a_5k_token_document_fits_smollm2s_8k_window_beside_a_quarter_for_the_conversation(embedded_model):
    from engine import DocumentSession

    model, tokenizer = embedded_model
    session = DocumentSession(model, tokenizer, OffloadPolicy())
    assert session.answer_budget == 8192 // 4  # a quarter of the window (4,096 only from a 16K window on)
    tokens = session.tokenize("The keeper trimmed the wick and climbed the stairs again. " * 460)
    assert 5_000 <= len(tokens) <= 5_600
    plan = session.plan(tokens)
    assert plan.is_within_limit and plan.context_limit == 8192
    html = render.plan_panel(plan, len(tokens), 10.0, conversation_tokens=session.answer_budget)
    assert 'data-fits="true"' in html and 'data-documents-share="6144"' in html
    assert "Documents' share" in html and "6,144 tokens · 2,048 kept for the conversation" in html


def test_the_conversation_allowance_is_a_quarter_of_the_window_at_most_4096():
    from engine.planning.window import conversation_allowance

    assert [conversation_allowance(w) for w in (2048, 8192, 16384, 131072, None)] == [512, 2048, 4096, 4096, 4096]


def test_a_plan_that_fits_never_says_longer_texts_need_another_model():
    shape = ModelShape.from_config(LlamaConfig(num_hidden_layers=2, num_key_value_heads=2, head_dim=16,
                                               num_attention_heads=4, hidden_size=64,
                                               max_position_embeddings=8192), dtype_bytes=4)
    fits = make_plan(shape, OffloadPolicy(), 3_000, device_is_cuda=False, gpu_budget=None, host_budget=32 * GIB)
    assert fits.limited_by == "model" and "long-context model" in fits.limit_reason  # the engine's refusal words
    html = render.plan_panel(fits, 1_000, 10.0, conversation_tokens=2048)
    assert ">Fits" in html and "long-context model" not in html
    assert "Documents may take up to 6,144 tokens here (the model&#x27;s window: 8,192 tokens, less 2,048" in html
    too_long = make_plan(shape, OffloadPolicy(), 9_000, device_is_cuda=False, gpu_budget=None, host_budget=32 * GIB)
    html = render.plan_panel(too_long, 7_000, 10.0, conversation_tokens=2048)
    assert "Too long for this model" in html and "long-context model" in html  # said where it is the verdict


def test_a_set_not_read_whole_says_the_context_it_needs_not_that_it_is_reserved():
    # Issue 51: a too-large file's plan said "11,267 tokens reserved" beside an 8,192-token window; nothing is
    # reserved for a set that is not read whole.
    shape = ModelShape.from_config(LlamaConfig(num_hidden_layers=2, num_key_value_heads=2, head_dim=16,
                                               num_attention_heads=4, hidden_size=64,
                                               max_position_embeddings=8192), dtype_bytes=4)
    too_long = make_plan(shape, OffloadPolicy(), 11_267, device_is_cuda=False, gpu_budget=None, host_budget=32 * GIB)
    html = render.plan_panel(too_long, 9_219, 10.0, conversation_tokens=2048)
    assert "Context reserved" not in html and 'data-context-tokens="11267"' in html
    assert "<span>Context needed</span><b>11,267 tokens · more than the 8,192-token limit: none reserved</b>" in html
    no_memory = make_plan(shape, OffloadPolicy(), 6_000, device_is_cuda=False, gpu_budget=None, host_budget=1 << 20)
    assert not no_memory.fits
    assert "6,000 tokens · more than memory holds: none reserved" in render.plan_panel(no_memory, 5_000, 10.0)
    fits = make_plan(shape, OffloadPolicy(), 3_000, device_is_cuda=False, gpu_budget=None, host_budget=32 * GIB)
    assert "<span>Context reserved</span><b>3,000 tokens</b>" in render.plan_panel(fits, 1_000, 10.0)
