"""The KV core's safety rules and its lean hot loop, each checked where the logic runs without a GPU.

The CUDA-only halves (real streams, events, cudaHostRegister) are in ``test_gpu_kv_core.py``.
"""

from __future__ import annotations

import gc

import pytest
import torch
from fake_cuda_runtime import FakeRuntime
from opcount import OpCounter
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig, MistralConfig

import engine
from engine.attention import headinfer_attention, headinfer_mask
from engine.errors import PinningError, PlanError, RouteError
from engine.kv import HostMemory, Transfer, kernels, route
from engine.kv import streams as kv_streams


# -- 1. host memory is unlocked only after the copy streams are idle -------------------------------
@pytest.mark.parametrize("how", ["free", "free_all", "garbage"])
def test_registered_memory_is_fenced_before_it_is_unregistered(how):
    log = []
    memory = HostMemory(True, fence=lambda: log.append("fence"), runtime=FakeRuntime(log))
    tensor = memory.empty((4, 1, 2, 1, 8), torch.float32)
    assert log == ["register"] and memory.num_registered == 1
    if how == "free":
        memory.free(tensor)
    elif how == "free_all":
        memory.free_all()
    else:
        del memory
        gc.collect()
    assert log == ["register", "fence", "unregister"]


# -- 2. a refused registration is a clear planning error, the runtime error cleared, no fallback ---
def test_refused_registration_is_a_planning_error_and_clears_the_runtime_error(monkeypatch):
    log = []
    memory = HostMemory(True, fence=lambda: None, runtime=FakeRuntime(log, refuse=True))
    pinned_allocations = []
    real_empty = torch.empty

    def spy_empty(*args, **kwargs):
        pinned_allocations.append(kwargs.get("pin_memory", False))
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", spy_empty)
    with pytest.raises(PinningError, match="could not page-lock .* GiB .*out of memory") as raised:
        memory.empty((1024, 1, 2, 1, 64), torch.float32)
    assert isinstance(raised.value, PlanError)
    assert log == ["register", "clear"]
    assert not any(pinned_allocations), "no silent fallback to torch's rounding pinned allocator"


class RegistrationTable(FakeRuntime):
    """The runtime's registrations as the driver keeps them: a range registered twice is refused (712)."""

    def __init__(self, log: list):
        super().__init__(log)
        self.registered: set[int] = set()

    def host_register(self, pointer: int, num_bytes: int) -> int:
        super().host_register(pointer, num_bytes)
        if pointer in self.registered:
            return 712  # cudaErrorHostMemoryAlreadyRegistered
        self.registered.add(pointer)
        return 0

    def host_unregister(self, pointer: int) -> int:
        super().host_unregister(pointer)
        self.registered.discard(pointer)
        return 0


def test_the_double_registering_test_runtime_leaves_nothing_registered_when_it_refuses():
    """The GPU test's refusal (``DoubleRegistering``) must leave the driver as a real refusal does: the first GPU
    run's version kept the first registration of memory then freed, and broke the next test's ``model.cuda()``."""
    from double_registering import DoubleRegistering

    log = []
    table = RegistrationTable(log)
    memory = HostMemory(True, fence=lambda: None, runtime=DoubleRegistering(table))
    with pytest.raises(PinningError):
        memory.empty((1 << 12,), torch.uint8)
    assert table.registered == set() and memory.num_registered == 0
    assert log == ["register", "register", "unregister", "clear"]


# -- shared tiny models ----------------------------------------------------------------------------
def tiny_llama(num_layers=3, num_kv_heads=2, **extra):
    dims = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, **extra}
    cfg = LlamaConfig(num_hidden_layers=num_layers, num_key_value_heads=num_kv_heads, vocab_size=97,
                      max_position_embeddings=256, **dims)
    torch.manual_seed(0)
    stock = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    headinfer = AutoModelForCausalLM.from_config(cfg, attn_implementation="headinfer").eval()
    headinfer.load_state_dict(stock.state_dict())
    return stock, headinfer


def ids_of(length: int, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, 97, (1, length), generator=torch.Generator().manual_seed(seed))


# -- 3. an exception inside the loop never leaves a buffer acquired --------------------------------
@torch.inference_mode()
def test_exception_between_acquire_and_release_leaves_no_buffer_in_use(monkeypatch):
    stock, headinfer = tiny_llama()
    ids = ids_of(20)
    cache = engine.HeadInferCache(headinfer.config, head_group_size=1, resident_slots=0, device="cpu")
    headinfer(ids[:, :12], past_key_values=cache)
    real = kernels.attend_span
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("simulated kernel failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(kernels, "attend_span", failing)
    with pytest.raises(RuntimeError, match="simulated"):
        headinfer(ids[:, 12:], past_key_values=cache)
    assert cache.transfer.is_idle, "the failing group's buffer must be released"
    monkeypatch.setattr(kernels, "attend_span", real)
    cache.crop_to(12)  # back to the last consistent boundary, then the same chunk again
    actual = headinfer(ids[:, 12:], past_key_values=cache).logits
    expected = stock(ids).logits[:, 12:]
    assert torch.allclose(actual, expected, rtol=1e-5, atol=1e-5)


# -- 4. flash-attn arguments ----------------------------------------------------------------------
def test_flash_kwargs_pass_softcap_only_when_set_and_a_window_only_when_keys_exceed_it():
    plain = kernels.flash_kwargs(k_len=100, scaling=0.1, window=None, softcap=None)
    assert plain == {"softmax_scale": 0.1, "causal": True}
    assert "window_size" not in kernels.flash_kwargs(k_len=64, scaling=0.1, window=64, softcap=None)
    assert kernels.flash_kwargs(k_len=65, scaling=0.1, window=64, softcap=None)["window_size"] == (63, 0)
    assert kernels.flash_kwargs(k_len=10, scaling=0.1, window=None, softcap=50.0)["softcap"] == 50.0
    assert "softcap" not in kernels.flash_kwargs(k_len=10, scaling=0.1, window=None, softcap=0.0)


# -- 5. no [heads, chunk, keys] score tensor: the tiled path builds per-tile masks, and is exact -----
@pytest.mark.parametrize("window", [None, 24])
@pytest.mark.parametrize("softcap", [None, 3.0])
def test_tiled_attention_is_exact_and_builds_masks_per_key_tile(monkeypatch, window, softcap):
    torch.manual_seed(0)
    q_len, past, heads, kv_heads, dim = 10, 50, 4, 2, 16
    query = torch.randn(1, heads, q_len, dim, dtype=torch.float64)
    key, value = (torch.randn(1, kv_heads, past + q_len, dim, dtype=torch.float64) for _ in range(2))
    widths = []
    real_mask = kernels._visibility_mask

    def spy(q_len, q_offset, window, k_start, k_stop, device):
        widths.append(k_stop - k_start)
        return real_mask(q_len, q_offset, window, k_start, k_stop, device)

    monkeypatch.setattr(kernels, "_TILE", 16)
    monkeypatch.setattr(kernels, "_visibility_mask", spy)
    out = kernels._tiled(query, key, value, past, 0.25, window, softcap)
    assert widths and max(widths) <= 16
    # Reference: the whole score matrix at once, in float64.
    k, v = key.repeat_interleave(2, dim=1), value.repeat_interleave(2, dim=1)
    scores = query @ k.transpose(2, 3) * 0.25
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    visible = real_mask(q_len, past, window, 0, past + q_len, "cpu")
    expected = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v
    assert torch.allclose(out, expected, atol=1e-6)  # the tiles accumulate in fp32, as eager attention does


@pytest.mark.parametrize("window", [None, 12])
def test_fused_route_without_an_applicable_kernel_falls_back_to_tiles_not_math(monkeypatch, window):
    """On CUDA, SDPA runs with its math kernel disabled; where no fused kernel takes the call (here: only cuDNN
    allowed, which the CPU lacks) it falls back to the tiled path instead of materialising the scores, with a
    sliding window (the ``window-blocks`` route) or without."""
    from torch.nn.attention import SDPBackend

    assert SDPBackend.MATH not in kernels._FUSED and SDPBackend.MATH not in kernels._WINDOW_FUSED
    torch.manual_seed(0)
    query = torch.randn(1, 4, 8, 16)
    key, value = (torch.randn(1, 2, 40, 16) for _ in range(2))
    if window is None:
        expected = kernels._sdpa(query, key, value, 32, 0.25, None, 2)
    else:
        expected = kernels._windowed(query, key, value, 32, 0.25, window, fused=False)
    monkeypatch.setattr(kernels, "_FUSED", [SDPBackend.CUDNN_ATTENTION])
    monkeypatch.setattr(kernels, "_WINDOW_FUSED", [SDPBackend.CUDNN_ATTENTION])
    before = kernels.ROUTE_COUNTS["tiled-math"]
    if window is None:
        out = kernels._sdpa_fused(query, key, value, 32, 0.25, None, 2)
    else:
        out = kernels._windowed(query, key, value, 32, 0.25, window, fused=True)
    assert kernels.ROUTE_COUNTS["tiled-math"] == before + 1
    assert torch.allclose(out, expected, atol=1e-5)


# -- 6. no device synchronisation on decode steps --------------------------------------------------
def test_padding_check_reads_the_mask_only_on_a_forwards_first_chunk():
    # A meta tensor has no values: reading it raises, so returning None proves the values were not read.
    device_mask = torch.ones(1, 9, dtype=torch.bool, device="meta")
    assert headinfer_mask(1, q_length=1, kv_length=9, attention_mask=device_mask) is None
    with pytest.raises((NotImplementedError, RuntimeError)):
        headinfer_mask(1, q_length=9, kv_length=9, attention_mask=device_mask)
    with pytest.raises(ValueError, match="padded"):  # CPU masks are always checked: reading them is free
        headinfer_mask(1, q_length=1, kv_length=3, attention_mask=torch.tensor([[0, 1, 1]]))


# -- 7. a fetch waits only for appends of tokens it reads ------------------------------------------
def test_fetch_waits_for_earlier_appends_but_not_for_the_current_chunk():
    transfer = Transfer(torch.device("cpu"), num_layers=1, num_groups=1, group_shape=(1, 1, 4),
                        dtype=torch.float32, buffer_tokens=8, stage_tokens=4)
    transfer._appends[0].entries = [(10, "append@10"), (20, "append@20")]
    assert transfer._landing(0, 20) == "append@10"  # reads [.., 20): the chunk landing at 20 is not needed
    assert transfer._landing(0, 21) == "append@20"
    assert transfer._landing(0, 5) == "append@10"  # older appends: the oldest kept one covers them


# -- 8. prefetch crosses forward boundaries ------------------------------------------------------------
@torch.inference_mode()
def test_decode_steps_find_every_offloaded_slot_prefetched():
    stock, headinfer = tiny_llama()
    cache = engine.HeadInferCache(headinfer.config, head_group_size=1, resident_slots=0, device="cpu")
    headinfer(ids_of(16), past_key_values=cache)
    for step in range(4):
        before = cache.transfer.num_on_demand
        headinfer(torch.tensor([[step + 1]]), past_key_values=cache)
        assert cache.transfer.num_on_demand == before, f"decode step {step} fetched a slot on demand"
    assert cache.transfer.num_fetches > 0


# -- 9. the attention function finds its layer through a checked route ----------------------------------
class CloningCache(engine.HeadInferCache):
    """Hands attention copies of the key states, as a model that transformed them after the update would."""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        return keys.clone(), values.clone()


@torch.inference_mode()
def test_key_states_replaced_after_the_update_raise_instead_of_attending_the_chunk_alone():
    _, headinfer = tiny_llama()
    with pytest.raises(RouteError, match="not the ones HeadInferCache returned"):
        headinfer(ids_of(8), past_key_values=CloningCache(headinfer.config, device="cpu"))


def test_attention_without_a_matching_layer_raises_while_a_headwise_forward_is_in_flight():
    key = torch.randn(1, 2, 4, 16)
    route.publish(5, object(), key)
    module = torch.nn.Module()  # no layer_idx
    try:
        with pytest.raises(RouteError, match="found no KV route"):
            headinfer_attention(module, torch.randn(1, 4, 4, 16), key, key, None)
    finally:
        route.clear()
    # With nothing in flight the function serves a stock cache: plain attention on the given keys.
    out, _ = headinfer_attention(module, torch.randn(1, 4, 4, 16), key, key, None)
    assert out.shape == (1, 4, 4, 16)


# -- the lean hot loop: dispatcher ops per decode step vs stock ---------------------------------------

@torch.inference_mode()
def _decode_ops(model, cache, context: int = 16) -> tuple[int, torch.Tensor]:
    model(ids_of(context), past_key_values=cache)
    model(torch.tensor([[5]]), past_key_values=cache)  # warm: buffers allocated, prefetches in flight
    counter = OpCounter()
    with counter:
        logits = model(torch.tensor([[7]]), past_key_values=cache).logits
    return sum(counter.ops.values()), logits


@pytest.mark.parametrize("group, context, max_context", [(8, 16, None), (1, 16, None), (1, 56, 64), (2, 56, 64)])
def test_decode_step_dispatches_at_most_a_few_times_the_ops_of_stock(group, context, max_context):
    """Llama-3-8B's layout (32 layers x 8 KV heads, 32 query heads), every slot offloaded; tiny widths.

    Group 1 (eight groups a layer) stays within 1.3x too: a layer's adjacent groups are one run, fetched with one
    batched copy and attended in one call (it was 3.2x with a fetch, a device copy and an attention per group).
    Also near the planned context (58 of 64 tokens): each ping-pong buffer holds the plan's groups per buffer (here
    a layer's eight), so the run stays whole (with buffers of one group it was one group per run again, 3.1x)."""
    cfg = dict(hidden_size=256, intermediate_size=64, num_attention_heads=32, head_dim=8)
    stock, headinfer = tiny_llama(num_layers=32, num_kv_heads=8, **cfg)
    stock_ops, expected = _decode_ops(stock, DynamicCache(config=stock.config), context)
    cache = engine.HeadInferCache(headinfer.config, head_group_size=group, resident_slots=0, device="cpu",
                                  max_context=max_context)
    ops, actual = _decode_ops(headinfer, cache, context)
    assert cache.kv_bytes()["host"] > 0 and cache.plan.resident_slots == 0
    assert ops <= 1.3 * stock_ops, f"{ops} ops vs stock {stock_ops} ({ops / stock_ops:.2f}x)"
    assert cache.plan.groups_per_buffer == 8 // group  # no budget: a layer's whole run
    assert torch.equal(actual.argmax(-1), expected.argmax(-1))
    assert torch.allclose(actual, expected, rtol=1e-5, atol=1e-5)


class CountingStreams(kv_streams.SyncStreams):
    """Synchronous streams counting what a GPU would turn into CUDA calls: copies and event calls."""

    def __init__(self):
        super().__init__()
        self.copies, self.events = 0, 0
        outer = self

        class Stream(kv_streams._SyncStream):
            def wait_event(self, event):
                outer.events += 1

        class Event(kv_streams._SyncEvent):
            def record(self, stream=None):
                outer.events += 1

        self._event_class, self._stream_class = Event, Stream
        self._compute = Stream("compute")

    def new_stream(self, name):
        return self._stream_class(name)

    def event(self, blocking=False):
        return self._event_class()

    def copy(self, dst, src, what=""):
        self.copies += 1
        super().copy(dst, src, what)

    def copy_many(self, dsts, srcs, what=""):
        self.copies += 1
        super().copy_many(dsts, srcs, what)


@torch.inference_mode()
def test_a_decode_step_issues_copies_and_events_per_layer_not_per_group(monkeypatch):
    """Eight groups a layer (group 1) cost a decode step the copy and event calls of one (group 8): a layer's
    append is one batched copy, its streamed groups one run (one fetch, one device copy of the new token, one set
    of events)."""
    monkeypatch.setattr(kv_streams, "make", lambda *args, **kwargs: CountingStreams())
    _, headinfer = tiny_llama(num_layers=4, num_kv_heads=8, hidden_size=64, num_attention_heads=8, head_dim=8)
    calls = {}
    for group in (1, 8):
        cache = engine.HeadInferCache(headinfer.config, head_group_size=group, resident_slots=0, device="cpu")
        headinfer(ids_of(16), past_key_values=cache)
        headinfer(torch.tensor([[5]]), past_key_values=cache)
        streams = cache.transfer.streams
        before = (streams.copies, streams.events)
        headinfer(torch.tensor([[7]]), past_key_values=cache)
        calls[group] = (streams.copies - before[0], streams.events - before[1])
        cache.release()
    assert calls[1] == calls[8], calls
    copies, events = calls[1]
    # Per layer: 3 copies (the append, the run's fetch, this token after the fetched past) and 10 event calls (5 for
    # staging and the append, 5 for the run: its fetch waits for its buffer and the landed appends, records ready;
    # attention waits for ready, records free). Per group that was 2 copies and 5 event calls more.
    assert copies == 3 * 4 and events == 10 * 4, calls


@torch.inference_mode()
def test_the_budget_sets_the_groups_per_buffer_and_the_copies_per_token(monkeypatch):
    """A host budget (a CPU-only machine: the ping-pong buffers are host memory) that holds buffers of three groups'
    context and not four: the plan picks 3 groups per buffer, and a decode step near the planned context fetches
    each layer's eight streamed groups in ceil(8 / 3) = 3 copies, where buffers of one group took 8."""
    monkeypatch.setattr(kv_streams, "make", lambda *args, **kwargs: CountingStreams())
    stock, headinfer = tiny_llama(num_layers=4, num_kv_heads=8, hidden_size=64, num_attention_heads=8, head_dim=8)
    options = dict(head_group_size=1, resident_slots=0, device="cpu", max_context=64, chunk_size=16)
    budget = engine.HeadInferCache(headinfer.config, groups_per_buffer=3, **options).plan.host_bytes
    ids = ids_of(56)
    expected = stock(torch.cat([ids, torch.tensor([[5, 7]])], dim=1)).logits[:, -1]
    calls = {}
    for per_buffer in (1, None):  # the paper's one group per buffer, and the planner's choice within the budget
        cache = engine.HeadInferCache(headinfer.config, groups_per_buffer=per_buffer, host_memory=budget, **options)
        headinfer(ids, past_key_values=cache)
        headinfer(torch.tensor([[5]]), past_key_values=cache)
        streams = cache.transfer.streams
        before = streams.copies
        logits = headinfer(torch.tensor([[7]]), past_key_values=cache).logits[:, -1]
        calls[cache.plan.groups_per_buffer] = streams.copies - before
        assert cache.plan.fits and cache.ledger.peak("pingpong") == cache.plan.allocations["pingpong"]
        assert torch.allclose(logits, expected, rtol=1e-5, atol=1e-5)
        cache.release()
    # Per layer: the append, then per run its fetch and this token after the fetched past.
    assert calls == {1: 4 * (1 + 2 * 8), 3: 4 * (1 + 2 * 3)}, calls


# -- windows: prefill chunks much longer than the window, through the fetch buffers ---------------------
@torch.inference_mode()
def test_sliding_window_chunks_longer_than_the_window_match_stock():
    torch.manual_seed(0)
    cfg = MistralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=97, max_position_embeddings=256, sliding_window=6)
    stock = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    headinfer = AutoModelForCausalLM.from_config(cfg, attn_implementation="headinfer").eval()
    headinfer.load_state_dict(stock.state_dict())
    ids = ids_of(70)
    expected = stock(ids).logits
    cache = engine.HeadInferCache(headinfer.config, head_group_size=1, resident_slots=0, device="cpu")
    actual = torch.cat([headinfer(ids[:, s : s + 25], past_key_values=cache).logits for s in range(0, 70, 25)], 1)
    assert torch.allclose(actual, expected, rtol=1e-5, atol=1e-5)
    # The fetch buffers hold a window plus a chunk per group of a run, not the whole context.
    assert cache.plan.groups_per_buffer == 2  # the layer's two groups: one run
    assert cache.transfer._pingpong[0].kv.shape[0] <= 2 * (6 - 1 + cache.policy.chunk_size)
