"""Hybrid models: layers with a fixed-size state (convolution, linear attention) next to attention layers.

The parity grid (test_parity.py) checks their logits and greedy tokens; these tests check what is particular to
them: the state layers get no homes and no fetches, the cache goes back only where their state was kept, and a
model whose layers the engine cannot serve exactly is refused at load with the reason.
"""

from __future__ import annotations

import pytest
import torch
from archs import build_pair
from parity import rel_diff
from transformers import AutoConfig, DynamicCache, FalconH1Config, Lfm2Config
from transformers.cache_utils import LinearAttentionLayer

import engine
from engine.errors import SnapshotError, UnsupportedModelError
from engine.kv.transfer import Transfer
from engine.models.loader import check_supported, load_model
from engine.planning.shape import unsupported_layers

HYBRIDS = ["lfm2-hybrid", "qwen3-next-hybrid", "qwen3.5-hybrid", "granite4-hybrid"]
RTOL = 1e-5


@pytest.fixture(scope="module", params=HYBRIDS)
def pair(request, tmp_path_factory):
    stock, headinfer = build_pair(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, stock, headinfer


def ids_of(length: int, vocab: int = 97) -> torch.Tensor:
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(3))


def feed(model, ids: torch.Tensor, cache, chunk: int = 8) -> torch.Tensor:
    return torch.cat([model(ids[:, s : s + chunk], past_key_values=cache, use_cache=True).logits
                      for s in range(0, ids.shape[1], chunk)], dim=1)


@torch.inference_mode()
def test_state_layers_get_no_homes_and_no_fetches(pair, monkeypatch):
    name, stock, headinfer = pair
    fetched = []
    for method in ("acquire", "prefetch"):
        original = getattr(Transfer, method)
        monkeypatch.setattr(Transfer, method, lambda self, slot, *a, _f=original, **k: (fetched.append(slot),
                                                                                         _f(self, slot, *a, **k))[1])
    cache = engine.HeadInferCache(headinfer.config, resident_slots=0, head_group_size=1, max_context=64)
    feed(headinfer, ids_of(30), cache)
    kinds = [type(layer) for layer in cache.layers]
    assert kinds == [LinearAttentionLayer, engine.cache.HeadInferLayer, LinearAttentionLayer], name
    assert cache.shape.state_layers == (0, 2) and cache.shape.num_layers == 1
    assert [layer.layer_idx for layer in cache.kv_layers] == [1]
    assert fetched and {run.layer for run in fetched} == {0}  # KV index 0: the model's layer 1, only
    # The homes hold one layer's K/V: the KV bytes per token count the attention layer alone.
    assert cache.kv_bytes()["host"] == 64 * cache.shape.kv_bytes_per_token
    assert cache.shape.kv_bytes_per_token == 2 * 16 * 2 * 4  # 2 KV heads x 16 dims x (K, V) x fp32


@torch.inference_mode()
def test_crop_goes_back_to_the_anchor_exactly(pair):
    """A document, then two different questions from its end: each answers as if asked first (stock's logits)."""
    name, stock, headinfer = pair
    document, questions = ids_of(30), [ids_of(37)[:, 30:], ids_of(41)[:, 30:] + 1]
    cache = engine.HeadInferCache(headinfer.config, resident_slots=0)
    feed(headinfer, document, cache)
    cache.anchor()
    for question in questions:
        actual = feed(headinfer, question, cache)
        reference = DynamicCache(config=stock.config)
        expected = stock(torch.cat([document, question], dim=1), past_key_values=reference).logits[:, 30:]
        assert rel_diff(actual, expected) < RTOL, name
        assert cache.restorable_length(cache.get_seq_length() - 1) == 30  # the states were kept at the anchor only
        with pytest.raises(ValueError, match="hybrid"):
            cache.crop_to(cache.get_seq_length() - 1)
        cache.crop_to(30)
    assert cache.restorable_length(29) == 0
    cache.crop_to(0)  # starting over is always possible
    assert rel_diff(feed(headinfer, document, cache), stock(document).logits) < RTOL


@torch.inference_mode()
def test_a_hybrid_cache_is_not_saved_as_a_snapshot(pair, tmp_path):
    from engine.store.files import write_snapshot
    from engine.store.fingerprint import ModelFingerprint, token_ids_digest
    from engine.store.format import SnapshotIdentity

    name, _, headinfer = pair
    ids = ids_of(20)
    cache = engine.HeadInferCache(headinfer.config, resident_slots=0)
    feed(headinfer, ids, cache)
    identity = SnapshotIdentity(ModelFingerprint(name, name, "0", "0"), "float32", "0",
                                token_ids_digest(ids[0].tolist()), 20)
    with pytest.raises(SnapshotError, match="hybrid"):  # it would come back without its states
        write_snapshot(tmp_path / "snap", cache, identity, ids[0].tolist())
    assert not (tmp_path / "snap").exists()


def test_layers_without_an_exact_path_are_refused_with_the_reason(tmp_path):
    assert unsupported_layers(FalconH1Config()) is not None  # each layer holds attention K/V and an SSM state
    assert "no attention layer" in unsupported_layers(Lfm2Config(num_hidden_layers=2, layer_types=["conv", "conv"]))
    shared = AutoConfig.for_model("gemma3_text")
    shared.kv_sharing_modes = ["store", "reuse"] * (shared.num_hidden_layers // 2)
    assert "reuses K/V" in unsupported_layers(shared)  # a consumer with no producer: refused, saying why
    check_supported(Lfm2Config(num_hidden_layers=2, layer_types=["conv", "full_attention"]))
    # A supported family with layers it cannot serve: refused from the config alone, before any weight is read.
    Lfm2Config(num_hidden_layers=2, layer_types=["conv", "conv"]).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match="no attention layer"):
        load_model(str(tmp_path), with_tokenizer=False)
    with pytest.raises(ValueError, match="no attention layer"):
        engine.HeadInferCache(Lfm2Config(num_hidden_layers=2, layer_types=["conv", "conv"]))


def word_tokenizer(vocab: int = 97):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="w0")


@torch.inference_mode()
def test_a_session_asks_follows_up_and_starts_over_exactly(pair):
    """The studio's flow: read once, ask, follow up, new conversation, ask again: every answer is stock's."""
    from engine import DocumentSession, OffloadPolicy

    name, stock, headinfer = pair
    tokenizer = word_tokenizer()
    document = " ".join(f"w{(7 * i) % 90 + 5}" for i in range(40))
    session = DocumentSession(headinfer, tokenizer, OffloadPolicy(chunk_size=16), answer_budget=64)
    session.set_document(document)
    session.prefill()

    def stock_answer(turns, question: str) -> str:
        ids = session.prompts.document_ids(document) + session.prompts.conversation_ids(document, turns, question)
        out = stock.generate(torch.tensor([ids]), max_new_tokens=6, min_new_tokens=6, do_sample=False)
        return tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)

    def ask(question: str) -> str:
        return list(session.ask(question, max_new_tokens=6, repetition_guard=None, sources=False))[-1].text

    first = ask("w9 w10")
    assert first.strip() == stock_answer([], "w9 w10").strip(), name
    follow_up = ask("w11")  # after the first turn: the cache goes back to the document's end, then on
    assert follow_up.strip() == stock_answer(session.turns[:1], "w11").strip(), name
    session.new_conversation()
    assert ask("w9 w10") == first
    # A history that parts from the cache within the last turn (past the document): the states cannot go
    # back there, so the session re-reads from the document's end.
    from engine.prompt import Turn

    session.turns = [Turn("w9 w10", "w3 w4")]
    assert ask("w12").strip() == stock_answer([Turn("w9 w10", "w3 w4")], "w12").strip(), name
