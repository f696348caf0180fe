"""The picker and the loader read one GPU budget and one weights rule: on a stand-in 4090 PC (24 GiB card) their
verdicts agree on models just inside and just outside each edge (bf16 / 8-bit, 8-bit / 4-bit)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.models import quantized
from engine.models.catalogue import Entry, Machine, plan_entry
from engine.planning.budgets import CUDA_CONTEXT_BYTES, card_budget, measure_budget
from engine.planning.policy import OffloadPolicy
from engine.planning.shape import ModelShape

GIB = 2**30
CARD = 24 * GIB


class StandInCard:
    """A quiet 24 GiB card as torch.cuda reads it: the CUDA context taken, nothing of ours held yet."""

    def mem_get_info(self, device=None):
        return CARD - CUDA_CONTEXT_BYTES, CARD

    def memory_reserved(self, device=None):
        return 0


def _config(num_layers: int, vocab: int) -> dict:
    return dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=num_layers,
                num_attention_heads=32, num_key_value_heads=8, vocab_size=vocab, max_position_embeddings=131072,
                tie_word_embeddings=False)


def _loader(num_layers: int, vocab: int) -> str:
    return quantized._auto_on_gpu(SimpleNamespace(**_config(num_layers, vocab)), "cuda", cuda=StandInCard())


def _picker(num_layers: int, vocab: int, machine: Machine) -> str:
    config = _config(num_layers, vocab)
    params = ModelShape.from_config(SimpleNamespace(**config)).num_params
    return plan_entry(Entry("edge/model", "llama", config, params, None, "apache-2.0"), machine).weights_mode


def _edge(verdict, inside: str, low: int = 1_000, high: int = 2_000_000) -> int:
    """The largest vocabulary (each token ``2 x hidden`` weights) ``verdict`` still gives ``inside``."""
    assert verdict(low) == inside and verdict(high) != inside
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if verdict(middle) == inside else (low, middle)
    return low


@pytest.mark.parametrize("num_layers, inside, outside", [(40, "dense", "8bit"), (80, "8bit", "4bit")])
def test_the_picker_and_the_loader_agree_at_the_edge_of_a_4090(num_layers, inside, outside):
    budget = measure_budget("cuda", OffloadPolicy(host_attention="off"), cuda=StandInCard()).gpu_budget
    assert budget == card_budget(CARD)  # the stand-in Machines of the picker's tests
    pc = Machine("RTX 4090 PC", True, budget, int(96 * GIB * 0.85), None, 1e14, 60.0, 900.0, h2d_gbps=24.0)
    edge = _edge(lambda vocab: _loader(num_layers, vocab), inside)
    assert _loader(num_layers, edge + 1) == outside
    assert [_picker(num_layers, vocab, pc) for vocab in (edge, edge + 1)] == [inside, outside]
