"""Tests for the memory planner against the HeadInfer paper's memory model."""

import pytest
import torch
from archs import llama3_8b_config
from transformers import Gemma2Config, Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from engine.errors import PlanError
from engine.planning.plan import Plan
from engine.planning.planner import make_plan, paper_memory_table
from engine.planning.policy import OffloadPolicy
from engine.planning.shape import ModelShape
from engine.read_time.flops import estimate_prefill_seconds

GIB = 1 << 30
MILLION = 2**20


@pytest.fixture
def llama() -> ModelShape:
    return ModelShape.from_config(llama3_8b_config(), dtype_bytes=2, num_params=8_030_000_000)


def close(value: float, expected: float, rel: float = 0.05) -> bool:
    return abs(value - expected) <= rel * expected


# --- ModelShape.from_config -------------------------------------------------------------------


def test_llama_shape_and_exact_param_estimate():
    shape = ModelShape.from_config(llama3_8b_config())
    assert (shape.num_layers, shape.num_heads, shape.num_kv_heads, shape.head_dim) == (32, 32, 8, 128)
    assert shape.num_params == 8_030_261_248  # the published Llama-3-8B count
    assert shape.sliding_windows == (None,) * 32
    assert shape.kv_bytes_per_token == 32 * 8 * 128 * 2 * 2  # 128 KiB per token


def test_mistral_sliding_window_on_every_layer():
    shape = ModelShape.from_config(MistralConfig(sliding_window=4096))
    assert shape.sliding_windows == (4096,) * 32
    assert shape.num_params == 7_241_732_096  # Mistral-7B
    assert ModelShape.from_config(MistralConfig(sliding_window=None)).sliding_windows == (None,) * 32


def test_gemma2_alternating_windows_tied_embeddings_explicit_head_dim():
    config = Gemma2Config(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
                          num_key_value_heads=4, head_dim=256, vocab_size=256000)
    shape = ModelShape.from_config(config)
    assert shape.head_dim == 256 != 2304 // 8
    assert shape.sliding_windows[:4] == (4096, None, 4096, None)
    assert shape.num_params == 2_614_341_888  # gemma-2-2b, embeddings counted once


def test_gemma3_text_pattern():
    config = Gemma3TextConfig(hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
                              num_key_value_heads=1, head_dim=256, vocab_size=262144, sliding_window=512)
    shape = ModelShape.from_config(config)
    assert shape.sliding_windows[:6] == (512,) * 5 + (None,)
    assert shape.num_params == 999_885_952  # gemma-3-1b


def test_qwen2_head_dim_derived_and_sliding_off():
    config = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                         use_sliding_window=False, sliding_window=4096)
    shape = ModelShape.from_config(config, dtype_bytes=4)
    assert shape.head_dim == 64 and shape.dtype_bytes == 4
    assert shape.sliding_windows == (None,) * 24
    assert shape.num_params == 494_032_768  # Qwen2.5-0.5B (biases, tied embeddings)


def test_qwen3_and_explicit_num_params():
    shape = ModelShape.from_config(Qwen3Config(num_hidden_layers=4), num_params=123)
    assert shape.num_params == 123 and shape.sliding_windows == (None,) * 4


# --- the paper's appendix table ---------------------------------------------------------------


def test_paper_table_reproduces_appendix_at_1m(llama):
    table = paper_memory_table(llama, MILLION, chunk_size=10240)
    expected_totals = {"standard": 207, "chunked_prefill": 143, "kv_quant_4bit": 111,
                       "layerwise_offload": 87, "headinfer": 16.7}
    for row, total in expected_totals.items():
        assert close(table[row]["total"], total), (row, table[row])
    assert table["standard"]["kv_gpu"] == 128 and table["standard"]["activation"] == 64
    assert table["chunked_prefill"]["activation"] == 0.625
    assert table["kv_quant_4bit"]["kv_gpu"] == 32 and table["kv_quant_4bit"]["kv_total"] == 32
    assert table["layerwise_offload"]["kv_gpu"] == 8 and table["layerwise_offload"]["kv_total"] == 128
    assert table["headinfer"]["kv_gpu"] == 1 and table["headinfer"]["kv_total"] == 128
    assert close(table["headinfer"]["weights"], 15.08)


def test_plan_matches_paper_headinfer_row(llama):
    # The paper's buffers hold one head group each (without a budget the planner would give them a layer's eight).
    policy = OffloadPolicy(chunk_size=10240, head_group_size=1, resident_slots=0, groups_per_buffer=1)
    plan = make_plan(llama, policy, MILLION, device_is_cuda=True)
    # The paper counts weights, KV buffers and activations; the plan adds what the engine really allocates besides:
    # SDPA's contiguous copy of one group's K/V (no flash-attn), here 2 x 1M tokens x 128 x bf16 = 0.5 GiB.
    assert plan.gpu_breakdown["attention"] == 2 * MILLION * 128 * 2
    assert plan.gpu_breakdown["kv_codes"] == plan.gpu_breakdown["sources"] == 0  # exact KV, no resident heads
    assert close((plan.gpu_bytes - plan.gpu_breakdown["attention"]) / GIB, 16.7)
    assert plan.host_bytes == 128 * GIB
    staging = 2 * 10240 * 8 * 128 * 2 * 2  # two chunks of K/V, every KV head, in home layout
    assert plan.gpu_breakdown["kv_buffers"] == 1 * GIB + staging
    assert (plan.num_groups, plan.total_slots, plan.fits, plan.reason) == (8, 256, True, "")
    assert "GiB" in plan.summary()


# --- monotonicity ------------------------------------------------------------------------------


def test_monotonic_in_context(llama):
    policy = OffloadPolicy(head_group_size=2, resident_slots=10)
    plans = [make_plan(llama, policy, n, device_is_cuda=True) for n in (1, 1000, 32768, 2**20, 2**22)]
    for a, b in zip(plans, plans[1:]):
        assert a.gpu_bytes <= b.gpu_bytes and a.host_bytes <= b.host_bytes


def test_smaller_group_uses_less_gpu(llama):
    gpu = [make_plan(llama, OffloadPolicy(head_group_size=g, resident_slots=0, groups_per_buffer=1), MILLION,
                     device_is_cuda=True).gpu_bytes for g in (1, 2, 4, 8)]
    assert gpu == sorted(gpu) and len(set(gpu)) == 4


def test_sliding_window_caps_device_and_host_kv():
    shape = ModelShape.from_config(MistralConfig(sliding_window=4096), num_params=7 * 10**9)
    policy = OffloadPolicy(chunk_size=1024, head_group_size=1, resident_slots=0)
    short, long = (make_plan(shape, policy, n, device_is_cuda=True) for n in (2**16, 2**20))
    assert short.gpu_breakdown["kv_buffers"] == long.gpu_breakdown["kv_buffers"]  # window + chunk
    ring = (4096 - 1 + 1024) * shape.num_layers * shape.num_kv_heads * shape.head_dim * 2 * shape.dtype_bytes
    assert short.host_bytes == long.host_bytes == ring  # every layer keeps a ring of window + chunk


def test_gemma3_host_kv_at_128k_drops_about_five_fold_with_window_rings():
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(num_hidden_layers=48, sliding_window=1024, num_key_value_heads=8, head_dim=128)
    shape = ModelShape.from_config(config, num_params=27 * 10**9)
    policy = OffloadPolicy(chunk_size=4096, head_group_size=1, resident_slots=0)
    plan = make_plan(shape, policy, 131072, device_is_cuda=True)
    every_token = 131072 * shape.kv_bytes_per_token
    assert 4.5 < every_token / plan.host_bytes < 6.0  # 1 layer in 6 is global: ~5x less host KV


# --- adaptive resolution -----------------------------------------------------------------------


def _largest_fitting_group(shape, context, budget):
    fitting = [g for g in (1, 2, 4, 8) if make_plan(shape, OffloadPolicy(head_group_size=g, resident_slots=0),
                                                    context, device_is_cuda=True, gpu_budget=budget).fits]
    return max(fitting) if fitting else None


@pytest.mark.parametrize(("context", "budget_gib", "expected"),
                         [(32768, 24, 8), (MILLION, 24, 4), (4 * MILLION, 24, 1), (MILLION, 18, 1), (MILLION, 17, 1)])
def test_adaptive_picks_largest_fitting_group(llama, context, budget_gib, expected):
    # At 1M / 24 GiB group 8 no longer fits: 15 GiB weights + 8 GiB buffers + 4 GiB for SDPA's contiguous K/V of
    # one group (planned since the ledger); group 4 does.
    plan = make_plan(llama, OffloadPolicy(), context, device_is_cuda=True, gpu_budget=budget_gib * GIB)
    assert plan.head_group_size == expected == _largest_fitting_group(llama, context, budget_gib * GIB)
    assert plan.fits


def test_adaptive_adds_resident_slots_with_spare_memory(llama):
    roomy = make_plan(llama, OffloadPolicy(), 32768, device_is_cuda=True, gpu_budget=24 * GIB)
    assert roomy.resident_slots == roomy.total_slots and roomy.host_bytes == 0
    partial = make_plan(llama, OffloadPolicy(), 262144, device_is_cuda=True, gpu_budget=20 * GIB)
    assert 0 < partial.resident_slots < partial.total_slots
    assert partial.fits and partial.gpu_bytes <= 20 * GIB
    # The planner takes every slot that fits: one more would overflow the budget.
    one_more = OffloadPolicy(head_group_size=partial.head_group_size, resident_slots=partial.resident_slots + 1)
    assert not make_plan(llama, one_more, 262144, device_is_cuda=True, gpu_budget=20 * GIB).fits
    tight = make_plan(llama, OffloadPolicy(), 4 * MILLION, device_is_cuda=True, gpu_budget=24 * GIB)
    assert tight.head_group_size == 1 and tight.resident_slots <= 1 and tight.fits  # one slot of 1 KV head at most


# --- groups per ping-pong buffer ------------------------------------------------------------------


@pytest.mark.parametrize("per_buffer", [1, 3, 8])
def test_buffers_hold_as_many_groups_as_the_budget_allows(llama, per_buffer):
    """Every slot streamed (group 1: eight a layer): a budget that holds buffers of ``per_buffer`` groups' context
    and not one more gets exactly that many, and the plan's allocations count them at that size."""
    fixed = OffloadPolicy(head_group_size=1, resident_slots=0, groups_per_buffer=per_buffer)
    budget = make_plan(llama, fixed, 131072, device_is_cuda=True).gpu_bytes
    policy = OffloadPolicy(head_group_size=1, resident_slots=0)
    plan = make_plan(llama, policy, 131072, device_is_cuda=True, gpu_budget=budget)
    assert (plan.groups_per_buffer, plan.fits) == (per_buffer, True)
    one_group = 131072 * 2 * 128 * 2  # K and V of one head at 128K tokens, bf16
    assert plan.allocations["pingpong"] == 2 * per_buffer * one_group
    assert plan.gpu_breakdown["kv_buffers"] - plan.allocations["staging"] == 2 * per_buffer * one_group
    if per_buffer > 1:  # a byte less: one group fewer
        assert make_plan(llama, policy, 131072, device_is_cuda=True,
                         gpu_budget=budget - 1).groups_per_buffer == per_buffer - 1


def test_buffers_never_outgrow_a_layers_longest_streamed_run(llama):
    assert make_plan(llama, OffloadPolicy(head_group_size=1, resident_slots=0), 4096,
                     device_is_cuda=True).groups_per_buffer == 8  # no budget: the whole layer
    # Every other slot resident: no two streamed groups are adjacent, so a buffer of two would buy nothing.
    alternate = make_plan(llama, OffloadPolicy(head_group_size=1, resident_slots=128), 4096, device_is_cuda=True)
    assert alternate.groups_per_buffer == 1
    assert make_plan(llama, OffloadPolicy(head_group_size=1, resident_slots=128, groups_per_buffer=4), 4096,
                     device_is_cuda=True).groups_per_buffer == 1


def test_long_contexts_keep_resident_slots_rather_than_grow_the_buffers(llama):
    """With resident slots adaptive, a buffer one group larger costs two slots: at 1M tokens a fetch of one group
    (0.5 GiB) is long next to its fixed cost, so the slots stay; where fetches are small, the buffers grow."""
    policy = OffloadPolicy(head_group_size=1)
    one = OffloadPolicy(head_group_size=1, groups_per_buffer=1)
    long = make_plan(llama, policy, MILLION, device_is_cuda=True, gpu_budget=24 * GIB)
    assert long.groups_per_buffer == 1
    assert long.resident_slots == make_plan(llama, one, MILLION, device_is_cuda=True,
                                            gpu_budget=24 * GIB).resident_slots > 0
    short = make_plan(llama, policy, 131072, device_is_cuda=True, gpu_budget=17 * GIB)
    assert short.groups_per_buffer > 1 and short.fits
    assert short.resident_slots < make_plan(llama, one, 131072, device_is_cuda=True, gpu_budget=17 * GIB).resident_slots


def test_policy_values_override(llama):
    policy = OffloadPolicy(head_group_size=4, resident_slots=3, gpu_memory=30 * GIB, host_memory=500 * GIB)
    plan = make_plan(llama, policy, MILLION, device_is_cuda=True, gpu_budget=GIB, host_budget=GIB)
    assert (plan.head_group_size, plan.resident_slots) == (4, 3)
    assert (plan.gpu_budget, plan.host_budget) == (30 * GIB, 500 * GIB)
    capped = make_plan(llama, OffloadPolicy(resident_slots=10**6), 1024, device_is_cuda=True)
    assert capped.resident_slots == capped.total_slots


def test_cpu_only_plan_is_all_host(llama):
    plan = make_plan(llama, OffloadPolicy(chunk_size=4096), 32768, device_is_cuda=False, host_budget=64 * GIB)
    assert plan.gpu_bytes == 0 and set(plan.gpu_breakdown.values()) == {0}
    assert (plan.head_group_size, plan.resident_slots) == (8, plan.total_slots)
    weights, kv = 8_030_000_000 * 2, 32768 * llama.kv_bytes_per_token
    activations = 4096 * (4096 + 2 * 14336) * 2
    staging = 2 * 4096 * 8 * 128 * 2 * 2  # two chunks of K/V in home layout: the KV core's buffers are host memory
    assert plan.host_bytes == weights + kv + activations + 128256 * 4 + staging
    assert plan.fits
    assert not make_plan(llama, OffloadPolicy(), 32768, device_is_cuda=False, host_budget=10 * GIB).fits


# --- budgets, reasons, max context --------------------------------------------------------------


def test_context_beyond_host_budget_does_not_fit(llama):
    plan = make_plan(llama, OffloadPolicy(head_group_size=1), MILLION, device_is_cuda=True,
                     gpu_budget=24 * GIB, host_budget=64 * GIB)
    assert not plan.fits and "host memory" in plan.reason
    with pytest.raises(PlanError, match="host memory"):
        plan.require_fit()


def test_gpu_budget_too_small_reason(llama):
    plan = make_plan(llama, OffloadPolicy(), 1024, device_is_cuda=True, gpu_budget=8 * GIB)
    assert not plan.fits and "GPU memory" in plan.reason and plan.max_context_tokens == 0
    with pytest.raises(PlanError):
        plan.require_fit()


@pytest.mark.parametrize("device_is_cuda", [True, False])
def test_max_context_is_consistent(llama, device_is_cuda):
    plan = make_plan(llama, OffloadPolicy(), 65536, device_is_cuda=device_is_cuda,
                     gpu_budget=20 * GIB, host_budget=200 * GIB)
    fixed = OffloadPolicy(head_group_size=plan.head_group_size, resident_slots=plan.resident_slots)
    limit = plan.max_context_tokens
    assert 65536 < limit < 2**31

    def at(n: int) -> Plan:
        return make_plan(llama, fixed, n, device_is_cuda=device_is_cuda, gpu_budget=20 * GIB, host_budget=200 * GIB)

    assert at(limit).fits and not at(limit + 1).fits and not at(limit + 1000).fits
    assert at(limit).max_context_tokens == limit


def test_unlimited_budgets_cap_max_context(llama):
    assert make_plan(llama, OffloadPolicy(head_group_size=1, resident_slots=0), 10,
                     device_is_cuda=True).max_context_tokens == 2**31


@pytest.mark.parametrize("context", [0, -5, 1.5, True])
def test_invalid_context_raises(llama, context):
    with pytest.raises(PlanError):
        make_plan(llama, OffloadPolicy(), context, device_is_cuda=True)


def test_invalid_inputs_raise(llama):
    with pytest.raises(PlanError, match="head_group_size"):
        make_plan(llama, OffloadPolicy(head_group_size=16), 100, device_is_cuda=True)
    with pytest.raises(PlanError, match="gpu_budget"):
        make_plan(llama, OffloadPolicy(), 100, device_is_cuda=True, gpu_budget=0)
    with pytest.raises(PlanError):
        paper_memory_table(llama, 0)
    with pytest.raises(PlanError):
        estimate_prefill_seconds(llama, 100, 0)
    assert issubclass(PlanError, ValueError)


def test_estimate_prefill_seconds(llama):
    assert estimate_prefill_seconds(llama, 0, 1e12) == 0
    one_k = estimate_prefill_seconds(llama, 1024, 1e15)
    expected = (2 * 8.03e9 * 1024 + 32 * 4 * 32 * 128 * 1024**2 / 2) / 1e15
    assert one_k == pytest.approx(expected)
    # Attention is quadratic, so doubling a long context more than doubles the time.
    assert estimate_prefill_seconds(llama, 2 * MILLION, 1e15) > 2.5 * estimate_prefill_seconds(llama, MILLION, 1e15)


# --- the model's trained window -----------------------------------------------------------------


def test_trained_window_reads_max_positions_and_rope_scaling():
    from engine.planning.window import trained_window

    assert trained_window(LlamaConfig(max_position_embeddings=8192)) == 8192
    llama31 = LlamaConfig(max_position_embeddings=131072, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0})
    assert trained_window(llama31) == 131072
    llama32 = LlamaConfig(max_position_embeddings=131072, rope_scaling={
        "rope_type": "llama3", "factor": 32.0, "original_max_position_embeddings": 8192,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0})
    assert trained_window(llama32) == 131072  # not 32 x 8,192: a llama3 entry's window is stated already
    linear = LlamaConfig(max_position_embeddings=16384, rope_scaling={"rope_type": "linear", "factor": 4.0})
    assert trained_window(linear) == 16384
    yarn = Qwen2Config(max_position_embeddings=32768,
                       rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    assert trained_window(yarn) == 131072  # Qwen2.5 with YaRN turned on
    assert ModelShape.from_config(yarn).max_positions == 131072


@pytest.mark.parametrize(("policy", "limited_by", "limit"), [
    (OffloadPolicy(), "model", 8192),
    (OffloadPolicy(max_context=4000), "max_context", 4000),
    (OffloadPolicy(exceed_trained_window=True), "memory", None),
    (OffloadPolicy(exceed_trained_window=True, max_context=50_000), "max_context", 50_000),
])
def test_the_context_limit_names_what_binds(policy, limited_by, limit):
    shape = ModelShape.from_config(LlamaConfig(num_hidden_layers=2, max_position_embeddings=8192))
    plan = make_plan(shape, policy, 10_000, device_is_cuda=False, host_budget=64 * GIB)
    assert plan.fits and plan.limited_by == limited_by
    assert plan.context_limit == (plan.max_context_tokens if limit is None else limit)
    assert plan.is_within_limit == (plan.context_limit >= 10_000)
    if limited_by == "model":
        assert "reads at most 8,192 tokens" in plan.limit_reason


def test_memory_binds_below_the_window():
    shape = ModelShape.from_config(LlamaConfig(num_hidden_layers=2, max_position_embeddings=1 << 20))
    plan = make_plan(shape, OffloadPolicy(), 1000, device_is_cuda=False, host_budget=600 << 20)
    assert plan.limited_by == "memory" and plan.context_limit == plan.max_context_tokens < 1 << 20


@pytest.mark.parametrize("name", ["qwen3-moe", "qwen2-moe", "mixtral"])
def test_mixture_of_experts_params_count_every_expert(name):
    """The estimate (used for models found on disk, before loading) equals the real count of the built model."""
    from transformers import AutoModelForCausalLM, MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

    common = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=97)
    config = {"qwen3-moe": lambda: Qwen3MoeConfig(**common, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                                  moe_intermediate_size=32, mlp_only_layers=[1]),
              "qwen2-moe": lambda: Qwen2MoeConfig(**common, num_experts=4, num_experts_per_tok=2,
                                                  moe_intermediate_size=32, shared_expert_intermediate_size=48,
                                                  decoder_sparse_step=2),
              "mixtral": lambda: MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2)}[name]()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert ModelShape.from_config(config).num_params == sum(p.numel() for p in model.parameters())
