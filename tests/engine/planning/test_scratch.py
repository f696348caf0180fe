"""The attention scratch (issue 30, item 2): the contiguous K/V that SDPA's fused kernels read live in one buffer per
cache, allocated once at its planned size and counted by the ledger, instead of a fresh copy per call that grew
with the context chunk by chunk (on CUDA the caching allocator then reserved every size it had handed out).

The fused routes run on CUDA only; ``kernels.FUSED_DEVICES`` is the seam that runs them on this CPU (CPU SDPA takes
the fused backends' calls), so the scratch's plumbing, its plan and its exactness are checked here."""

from __future__ import annotations

import pytest
import torch
from archs import build_pair, tiny_configs
from transformers import DynamicCache, LlamaConfig, MistralConfig

import engine
from engine.kv import buffers, kernels
from engine.kv.ledger import SCRATCH, Ledger
from engine.planning.allocations import planned_allocations, scratch_elements
from engine.planning.planner import make_plan
from engine.planning.policy import OffloadPolicy
from engine.planning.shape import ModelShape

CHUNK = 24  # more than native.CPU_QUERY_LIMIT: a prefill chunk (SDPA's fused routes where they are emulated on the CPU)
PROMPT = 90  # past the tiny windows (8): the windowed route runs too


@pytest.fixture
def fused_on_cpu(monkeypatch):
    monkeypatch.setattr(kernels, "FUSED_DEVICES", frozenset({"cuda", "cpu"}))
    kernels.ROUTE_COUNTS.clear()


class ScratchWatch:
    """Counts the scratch buffers a ledger makes and where every SDPA call's keys live."""

    def __init__(self, monkeypatch, ledger: Ledger):
        self.made: list[tuple[int, int]] = []  # (data_ptr, nbytes): holding the tensors would keep them alive
        self.key_ptrs: list[int] = []
        record = ledger.record

        def spy_record(category, tensor, device=None):
            if category == SCRATCH:
                self.made.append((tensor.data_ptr(), tensor.nbytes))
            return record(category, tensor, device)

        sdpa = torch.nn.functional.scaled_dot_product_attention

        def spy_sdpa(query, key, value, *args, **kwargs):
            if query.shape[2] > 1:  # prefill chunks (decode steps attend their blocks where they are)
                self.key_ptrs.append(key.data_ptr())
            return sdpa(query, key, value, *args, **kwargs)

        monkeypatch.setattr(ledger, "record", spy_record)
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy_sdpa)

    def inside(self, ptr: int) -> bool:
        start, nbytes = self.made[-1]
        return start <= ptr < start + nbytes


@pytest.mark.parametrize("name", ["llama-gqa", "mistral-window"])
@pytest.mark.parametrize("resident_slots", [None, 0], ids=["on-device-homes", "ping-pong"])
@torch.inference_mode()
def test_chunked_prefill_attends_from_one_scratch_allocated_once_and_matches_stock(
        fused_on_cpu, monkeypatch, tmp_path, name, resident_slots):
    """A 90-token prompt in chunks of 24 (fp32 GQA: K/V expanded for the memory-efficient kernel; a sliding
    window: query blocks): one scratch buffer, made when the cache allocates, at exactly the plan's bytes; every
    SDPA call of the prefill reads its keys from it; the logits match stock transformers."""
    stock, model = build_pair(name, tmp_path)
    cache = engine.HeadInferCache(model.config, device="cpu", max_context=128, chunk_size=CHUNK,
                                  resident_slots=resident_slots)
    watch = ScratchWatch(monkeypatch, cache.ledger)
    ids = torch.randint(0, model.config.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(7))
    logits = torch.cat([model(ids[:, s : s + CHUNK], past_key_values=cache, use_cache=True).logits
                        for s in range(0, PROMPT, CHUNK)], dim=1)
    planned = cache.plan.allocations[SCRATCH]
    assert planned > 0
    assert len(watch.made) == 1  # allocated once, at the first chunk, never again
    assert watch.made[0][1] == planned == cache.ledger.peak(SCRATCH)
    assert watch.key_ptrs and all(watch.inside(ptr) for ptr in watch.key_ptrs)
    routes = {"llama-gqa": "sdpa-fused", "mistral-window": "tiled-math"}  # CPU has no memory-efficient kernel
    assert kernels.ROUTE_COUNTS[routes[name]] > 0, kernels.ROUTE_COUNTS
    expected = stock(ids, past_key_values=DynamicCache(config=stock.config), use_cache=True).logits
    assert float((logits - expected).abs().max() / expected.abs().max()) < 1e-5
    cache.release()
    assert cache.ledger.held(SCRATCH) == 0


@pytest.mark.parametrize("name", sorted(tiny_configs()))
@torch.inference_mode()
def test_every_family_holds_its_scratch_to_the_plan(fused_on_cpu, name):
    """Every family, homes offloaded and resident, a prefill past the windows then decode steps: the ledger's
    scratch is exactly the planned bytes (allocated once, never grown), and every category stays within the plan."""
    from within_plan import assert_within_plan, model_of

    model = model_of(name)
    for resident_slots in (0, None):
        cache = engine.HeadInferCache(model.config, device="cpu", max_context=64, chunk_size=CHUNK,
                                      resident_slots=resident_slots)
        vocab = model.config.get_text_config().vocab_size  # the published Gemma 4 wrapper has no vocab_size
        ids = torch.randint(0, vocab, (60,), generator=torch.Generator().manual_seed(3)).tolist()
        for start in range(0, 60, CHUNK):
            logits = model(torch.tensor([ids[start : start + CHUNK]]), past_key_values=cache, use_cache=True).logits
        for _ in range(4):
            token = torch.tensor([[int(logits[0, -1].argmax())]])
            logits = model(token, past_key_values=cache, use_cache=True).logits
        assert cache.ledger.peak(SCRATCH) == cache.plan.allocations[SCRATCH] > 0
        assert_within_plan(cache)
        cache.release()


@torch.inference_mode()
def test_scratch_is_planned_in_the_ledger_categories_and_off_the_cpu_by_default(tmp_path):
    """Without the seam the CPU attends strided views: no scratch planned, none allocated, none used."""
    _, model = build_pair("llama-gqa", tmp_path)
    cache = engine.HeadInferCache(model.config, device="cpu", max_context=64, chunk_size=CHUNK, resident_slots=0)
    model(torch.arange(40)[None], past_key_values=cache, use_cache=True)
    assert cache.plan.allocations[SCRATCH] == 0 == cache.ledger.peak(SCRATCH)
    assert cache.transfer.scratch is None


def test_planned_scratch_is_one_group_of_visible_keys():
    """[2, B, g * expand, visible, D]: a group's K and V over what a ping-pong buffer holds; fp32 expands GQA to
    the query heads; a windowed model's visible keys are its window ring; only where the fused routes run."""
    llama = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                        num_key_value_heads=8, head_dim=128, vocab_size=128256)
    bf16, fp32 = (ModelShape.from_config(llama, dtype_bytes=b, num_params=8 * 10**9) for b in (2, 4))
    args = dict(capacity=100_000, chunk=4096, group=2, resident_slots=0, disk_slots=0, kv_dtype=None,
                host_attention=False)
    assert planned_allocations(bf16, cuda=True, **args)[SCRATCH] == 2 * 2 * 100_000 * 128 * 2
    assert planned_allocations(fp32, cuda=True, **args)[SCRATCH] == 2 * 2 * 4 * 100_000 * 128 * 4
    assert planned_allocations(bf16, cuda=False, **args)[SCRATCH] == 0
    mistral = ModelShape.from_config(MistralConfig(sliding_window=4096), dtype_bytes=2, num_params=7 * 10**9)
    assert scratch_elements(mistral, capacity=100_000, chunk=4096, group=1, cuda=True) == 2 * (4095 + 4096) * 128
    # The CUDA plan's attention holds the scratch buffer for the whole run, beside one call's temporaries.
    plan = make_plan(bf16, OffloadPolicy(head_group_size=2, resident_slots=0, groups_per_buffer=1), 100_000,
                     device_is_cuda=True)
    assert plan.gpu_breakdown["attention"] == plan.allocations[SCRATCH] == 2 * 2 * 100_000 * 128 * 2
    # Ping-pong buffers of several groups (``Plan.groups_per_buffer``) attend a run at once: the scratch holds it.
    plan = make_plan(bf16, OffloadPolicy(head_group_size=2, resident_slots=0, groups_per_buffer=3), 100_000,
                     device_is_cuda=True)
    assert plan.groups_per_buffer == 3
    assert plan.gpu_breakdown["attention"] == plan.allocations[SCRATCH] == 3 * 2 * 2 * 100_000 * 128 * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_route_writes_views_of_the_scratch_whatever_the_context(fused_on_cpu, dtype):
    """Chunks of a growing context through ``attend_span`` with one scratch: the same memory every call, no
    growth while within its size, and the result equal to the route's own copies (allocated per call)."""
    generator = torch.Generator().manual_seed(0)
    num_q, num_k, head_dim, chunk = 8, 2, 16, 32
    expand = num_q // num_k if dtype == torch.float32 else 1
    made = []
    scratch = buffers.Scratch(lambda n: made.append(n) or torch.empty(n, dtype=dtype), 2 * num_k * expand * 128 * head_dim)
    for past in (0, 32, 64, 96):
        block = torch.randn(past + chunk, 1, 2, num_k, head_dim, generator=generator).to(dtype)  # token-major
        query = torch.randn(1, num_q, chunk, head_dim, generator=generator).to(dtype)
        seen = []
        sdpa = torch.nn.functional.scaled_dot_product_attention
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                          lambda q, k, v, **kw: seen.append(k.data_ptr()) or sdpa(q, k, v, **kw))
            out = kernels.attend_span(query, block, q_offset=past, scaling=0.25, scratch=scratch)
            reference = kernels.attend_span(query, block, q_offset=past, scaling=0.25)
        assert seen[0] == scratch.flat.data_ptr()
        assert torch.equal(out, reference)
    assert len(made) == 1


def test_a_call_past_the_planned_size_grows_the_scratch_once_and_says_so(caplog):
    made = []
    scratch = buffers.Scratch(lambda n: made.append(n) or torch.empty(n), 2 * 10 * 4)
    key, value = torch.randn(2, 1, 1, 30, 4).unbind(0)
    with caplog.at_level("INFO", logger="engine.kv.buffers"):
        k, v = scratch.kv(key, value)
        scratch.kv(key, value)
    assert made == [80, 240] and torch.equal(k, key) and torch.equal(v, value)
    assert [r for r in caplog.records if "growing the attention scratch" in r.getMessage()]


def use_cuda_output_layouts(monkeypatch) -> None:
    """SDPA hands back its output laid out as CUDA's fused kernels write it: fp32 (the memory-efficient kernel)
    allocates [B, Q, H, D] and returns its transpose, whatever the query's strides; flash (bf16/fp16) allocates
    like the query (``empty_like``). CPU SDPA returns [B, H, Q, D] in order, which hid the first on this CPU."""
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def laid_out(query, key, value, *args, **kwargs):
        out = sdpa(query, key, value, *args, **kwargs)  # [B, H, Q, D]
        if query.dtype == torch.float32:
            return out.transpose(1, 2).contiguous().transpose(1, 2)
        return torch.empty_like(query).copy_(out)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", laid_out)


@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["float32", "bfloat16"])
@torch.inference_mode()
def test_runs_of_multi_head_groups_take_the_fused_kernels_output_layouts(fused_on_cpu, tmp_path, monkeypatch,
                                                                        dtype, rtol):
    """MHA (4 KV heads) in groups of 2: a layer's two groups are one run, attended as a batch of two
    (``PingPong.run_views``) and put back as [1, 4, Q, D]. With the memory-efficient kernel's output layout (fp32
    on CUDA) no view does that: the 2026-11-27 H200 run failed
    ``test_pingpong_prefill_matches_stock_for_every_group_size[llama-mha-float32-*]`` (bf16, through flash, passed).
    Every group size, the GPU test's 45-token prompt in chunks past the CPU tile, matches stock."""
    stock, model = build_pair("llama-mha", tmp_path, dtype=dtype)
    ids = torch.randint(0, model.config.vocab_size, (1, 45), generator=torch.Generator().manual_seed(7))
    expected = stock(ids).logits
    use_cuda_output_layouts(monkeypatch)
    for group in (1, 2, 4):
        cache = engine.HeadInferCache(model.config, device="cpu", head_group_size=group, resident_slots=0,
                                      chunk_size=CHUNK)
        logits = torch.cat([model(ids[:, s : s + CHUNK], past_key_values=cache, use_cache=True).logits
                            for s in range(0, 45, CHUNK)], dim=1)
        assert cache.plan.groups_per_buffer == 4 // group  # a layer's groups: one run
        assert float((logits - expected).abs().max() / expected.abs().max()) < rtol, group
    assert kernels.ROUTE_COUNTS["sdpa-fused"] > 0, kernels.ROUTE_COUNTS
