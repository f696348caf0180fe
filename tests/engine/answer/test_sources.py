"""Attention-grounded sources: exact attention weights from the cache's homes, bucketed by page."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import engine
from engine.answer import sources
from engine.kv.probe import QueryProbe
from engine.answer.sources import Source, rank_sources


@pytest.mark.parametrize("window, softcap", [(None, None), (5, None), (None, 2.0)])
def test_mass_is_the_exact_attention_of_each_query_summed(monkeypatch, window, softcap):
    torch.manual_seed(0)
    keys = torch.randn(40, 8)
    queries = torch.randn(6, 8)
    positions = [20, 25, 30, 35, 38, 39]
    monkeypatch.setattr(sources, "_TILE", 1)  # several tiles, the last one short
    mass = sources._mass(queries[None], keys[None], positions, 0.3, window, softcap)[0]
    expected = torch.zeros(40, dtype=torch.float64)
    for q, p in zip(queries.double(), positions):
        s = keys.double()[: p + 1] @ q * 0.3
        if softcap:
            s = torch.tanh(s / softcap) * softcap
        if window is not None:
            s[: max(0, p - window + 1)] = float("-inf")
        expected[: p + 1] += torch.softmax(s, dim=0)
    assert torch.allclose(mass, expected, atol=1e-6)
    assert abs(float(mass.sum()) - len(positions)) < 1e-5  # each query's weights sum to one


def test_pages_get_the_mass_of_their_tokens_and_shares_are_of_the_pages():
    mass = torch.zeros(30, dtype=torch.float64)
    mass[0] = 50.0  # the attention sink before the document: excluded from the shares
    mass[12:14] = 3.0  # page 2
    mass[20] = 2.0  # page 3
    pages = [(5, 1), (10, 2), (18, 3)]
    ranked = rank_sources(mass, (2, 28), pages)
    assert [s.page for s in ranked] == [2, 3]
    assert ranked[0].share == pytest.approx(0.75) and ranked[1].share == pytest.approx(0.25)
    assert ranked[0].label() == "p. 2 (75%)"
    assert rank_sources(mass, (2, 28), []) == [Source(None, 1.0)]


@torch.inference_mode()
def test_probe_and_mass_through_a_real_forward_match_a_reference_from_stock_weights():
    """The probe keeps the post-RoPE queries the schedule attends with: the mass computed from them and the
    homes equals the attention weights stock eager attention reports for the same head."""
    stock, model = _mixed_pair()
    ids = torch.randint(0, 97, (1, 30), generator=torch.Generator().manual_seed(1))
    cache = engine.HeadInferCache(model.config, device="cpu", resident_slots=0, head_group_size=1)
    cache.allocate(1, 16, torch.float32, torch.device("cpu"))
    probe = QueryProbe({1: [3]}, min_position=25)
    cache.record_queries(probe)
    model(ids, past_key_values=cache)
    mass = sources.attention_mass(cache, probe)
    captured = []
    hook = stock.model.layers[1].self_attn.register_forward_hook(lambda m, a, out: captured.append(out[1]))
    stock(ids, output_attentions=True)
    hook.remove()
    weights = captured[0][0, 3]  # eager attention's weights [Q, K] of layer 1, head 3
    assert probe.num_positions == 5
    assert torch.allclose(mass.float(), weights[25:].sum(0), atol=1e-5)


def _mixed_pair():
    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=97, max_position_embeddings=256)
    torch.manual_seed(0)
    stock = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    model = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="headinfer").eval()
    model.load_state_dict(stock.state_dict())
    return stock, model


@torch.inference_mode()
def test_mass_of_a_layer_with_resident_and_offloaded_homes_waits_for_the_copies_and_matches_stock(monkeypatch):
    """Head group 1 < 2 KV heads, one resident slot: layer 0 keeps KV head 0 resident and KV head 1 offloaded.
    The homes are read only after the cache has synchronised (the appends' copies have landed)."""
    stock, model = _mixed_pair()
    ids = torch.randint(0, 97, (1, 30), generator=torch.Generator().manual_seed(1))
    cache = engine.HeadInferCache(model.config, device="cpu", resident_slots=1, head_group_size=1)
    cache.allocate(1, 16, torch.float32, torch.device("cpu"))
    assert [home.group.is_resident for home in cache.layers[0].homes] == [True, False]
    probe = QueryProbe({0: [0, 3]}, min_position=25)  # query head 0 -> KV head 0, query head 3 -> KV head 1
    cache.record_queries(probe)
    model(ids, past_key_values=cache)
    events = []
    real_sync = cache.synchronize
    monkeypatch.setattr(cache, "synchronize", lambda: (events.append("synchronize"), real_sync())[1])
    for home in cache.layers[0].homes:
        real_block = home.block
        monkeypatch.setattr(home, "block", lambda a, b, real=real_block: (events.append("read"), real(a, b))[1])
    mass = sources.attention_mass(cache, probe, per_head=True)
    assert events[0] == "synchronize" and events.count("read") == 2
    captured = []
    hook = stock.model.layers[0].self_attn.register_forward_hook(lambda m, a, out: captured.append(out[1]))
    stock(ids, output_attentions=True)
    hook.remove()
    weights = captured[0][0]  # [H, Q, K] of layer 0
    assert torch.allclose(mass[0].float(), weights[0, 25:].sum(0), atol=1e-5)
    assert torch.allclose(mass[1].float(), weights[3, 25:].sum(0), atol=1e-5)


def test_keys_of_homes_on_different_devices_are_never_stacked_together():
    """A resident (device) home and an offloaded (host) one: each device's keys are stacked on their own, rows
    keep the order of the heads asked for. (The meta device stands in for the GPU on a CPU-only machine.)"""
    from types import SimpleNamespace

    def home(start, stop, device):
        kv = torch.zeros(12, 1, 2, stop - start, 8, device=device)  # [capacity, B, 2, g, D]
        return SimpleNamespace(group=SimpleNamespace(start=start, stop=stop), device=kv.device,
                               block=lambda a, b: kv[a:b])

    layer = SimpleNamespace(layer_idx=0, homes=[home(0, 1, "cpu"), home(1, 2, "meta"), home(2, 3, "cpu")])
    groups = sources._keys_by_device(layer, [0, 2, 3, 5], n_rep=2, length=10)  # KV heads 0, 1, 1, 2
    assert [(picked, keys.device.type, tuple(keys.shape)) for picked, keys in groups] == [
        ([0, 3], "cpu", (2, 10, 8)), ([1, 2], "meta", (2, 10, 8))]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.inference_mode()
def test_mass_on_cuda_with_a_resident_and_an_offloaded_home_in_one_layer():
    stock, model = _mixed_pair()
    model = model.cuda()
    ids = torch.randint(0, 97, (1, 30), generator=torch.Generator().manual_seed(1))
    cache = engine.HeadInferCache(model.config, device="cuda", resident_slots=1, head_group_size=1)
    cache.allocate(1, 16, torch.float32, torch.device("cuda"))
    assert [home.device.type for home in cache.layers[0].homes] == ["cuda", "cpu"]
    probe = QueryProbe({0: [0, 3]}, min_position=25)
    cache.record_queries(probe)
    model(ids.cuda(), past_key_values=cache)
    mass = sources.attention_mass(cache, probe, per_head=True)
    captured = []
    hook = stock.model.layers[0].self_attn.register_forward_hook(lambda m, a, out: captured.append(out[1]))
    stock(ids, output_attentions=True)
    hook.remove()
    assert torch.allclose(mass[1].float(), captured[0][0, 3, 25:].sum(0), atol=1e-4)
