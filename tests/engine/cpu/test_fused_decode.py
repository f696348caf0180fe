"""The fused CPU decode step (``engine/cpu/fused_decode.py``, ``gguf_decode.h``): the same logits and greedy
tokens as the model's own forward through the same cache, and as stock transformers on the same GGUF file; a stop
between layers; which models take it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf_samples import TYPES, needs_kernel
from parity import RTOL, rel_diff
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

import engine
from engine.cpu import fused_decode, gguf_blocks
from engine.cpu.fused_decode import FusedDecode
from engine.cpu.gguf_blocks import BlockLinear, random_block_rows
from engine.errors import ForwardInterrupted
from engine.kv import route
from engine.models.loader import _embedded_gguf, load_model
from engine.planning.policy import OffloadPolicy

# hidden and intermediate widths that are multiples of 256: the K types' super-blocks
_TINY = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=300, max_position_embeddings=512)
# every projection a type of its own across the layers: the Q4_K_M mix (Q4_K, Q6_K) and the legacy types
_TYPES = ["Q4_K", "Q6_K", "Q8_0", "Q4_1", "Q5_K", "Q4_0", "Q5_0"]


def blocked(config, seed: int = 0) -> torch.nn.Module:
    """A random model of ``config`` whose every projection is a ``BlockLinear`` of random blocks (biases kept),
    norms random too (ones would hide a norm weight applied wrongly), head-wise attention."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="headinfer").eval()
    rng = np.random.default_rng(seed)
    names = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    for index, name in enumerate(names):
        parent, _, attribute = name.rpartition(".")
        linear = model.get_submodule(name)
        qtype = TYPES[_TYPES[index % len(_TYPES)]]
        raw = random_block_rows(rng, qtype, linear.out_features, linear.in_features)
        bias = None if linear.bias is None else torch.randn(linear.out_features) * 0.1
        setattr(model.get_submodule(parent) if parent else model, attribute,
                BlockLinear(raw, qtype, linear.in_features, bias))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(1 + 0.2 * torch.randn_like(parameter))
    return model


CONFIGS = {
    "llama-gqa": LlamaConfig(**_TINY),
    # a window shorter than the prompt: the step must pass the window Mistral's attention reads from its config
    "mistral-window": MistralConfig(**_TINY, sliding_window=24),
    # per-head q/k RMSNorm; every other layer windowed: the window each layer's module holds
    "qwen3-qk-norm-window": Qwen3Config(**{**_TINY, "num_hidden_layers": 4}, head_dim=64, use_sliding_window=True,
                                        sliding_window=24, max_window_layers=1,
                                        layer_types=["full_attention", "sliding_attention"] * 2),
    "llama-mha-bias": LlamaConfig(**{**_TINY, "num_key_value_heads": 4}, attention_bias=True, mlp_bias=True),
    "qwen2-gqa-bias": Qwen2Config(**_TINY),  # q/k/v biases
    "llama3-rope-scaling": LlamaConfig(**_TINY, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                              "original_max_position_embeddings": 64}),
}


def _read(model, ids: torch.Tensor, policy: OffloadPolicy | None = None) -> engine.HeadInferCache:
    cache = engine.HeadInferCache(model.config, policy, chunk_size=64)
    model(ids, past_key_values=cache, use_cache=True)
    return cache


def _read_twice(name: str, seed: int, num_tokens: int, policy: OffloadPolicy | None = None):
    """(model, its fused step, two caches that read the same random prompt of ``num_tokens``)."""
    model = blocked(CONFIGS[name], seed=seed)
    fused = FusedDecode.for_model(model)
    assert fused is not None
    ids = torch.randint(0, 300, (1, num_tokens), generator=torch.Generator().manual_seed(seed))
    return model, fused, _read(model, ids, policy), _read(model, ids, policy)


@needs_kernel
@pytest.mark.parametrize("name", sorted(CONFIGS))
@torch.inference_mode()
def test_fused_steps_give_the_forwards_logits_and_greedy_tokens(name):
    model, fused, stock_cache, fused_cache = _read_twice(name, 0, 150)
    token = fused_token = 7
    for step in range(12):
        expected = model(torch.tensor([[token]]), past_key_values=stock_cache, use_cache=True).logits[0, -1]
        actual = fused.step(fused_token, fused_cache)
        assert rel_diff(actual, expected) < RTOL, step
        token, fused_token = int(expected.argmax()), int(actual.argmax())
        assert fused_token == token, step
        assert fused_cache.get_seq_length() == stock_cache.get_seq_length() == 151 + step


@needs_kernel
@pytest.mark.parametrize("name, prompt, policy", [
    ("llama-gqa", 150, None),
    ("qwen3-qk-norm-window", 150, None),  # its windowed layers' homes are rings: the generic path
    # a window (24) over plain homes: in place, masked; homes of 42 tokens: full at the third step, which takes the
    # generic path and grows them, the next steps in place again
    ("mistral-window", 40, OffloadPolicy(max_context=42)),
], ids=["llama-gqa", "rings", "window-growing"])
@torch.inference_mode()
def test_layers_with_one_plain_home_take_the_in_place_path_bit_for_bit_with_the_generic_one(name, prompt, policy,
                                                                                             monkeypatch):
    # the C call writes k and v into the home's row and the layer attends in place (HeadInferLayer.decode_row);
    # the same kernel over the same values as update + attend, so the same bits, the probe's queries included
    from engine.cache import HeadInferLayer
    from engine.kv.probe import QueryProbe

    _, fused, generic_cache, in_place_cache = _read_twice(name, 4, prompt, policy)
    heads = {layer: [0, 3] for layer in range(len(in_place_cache.kv_layers))}
    probes = [QueryProbe(heads, min_position=prompt), QueryProbe(heads, min_position=prompt)]
    generic_cache.record_queries(probes[0])
    in_place_cache.record_queries(probes[1])
    rows, updates, grown = [], [], 0
    decode_row, update = HeadInferLayer.decode_row, HeadInferLayer.update
    monkeypatch.setattr(HeadInferLayer, "update", lambda self, *a, **k: updates.append(self.kv_index) or
                        update(self, *a, **k))
    token = 9
    for step in range(6):
        monkeypatch.setattr(HeadInferLayer, "decode_row", lambda self: None)
        expected = fused.step(token, generic_cache)
        updates.clear()
        monkeypatch.setattr(HeadInferLayer, "decode_row", lambda self: rows.append(self.kv_index) or decode_row(self))
        layers = in_place_cache.kv_layers
        rings = [i for i, layer in enumerate(layers) if layer.homes.ring_window is not None]
        full = [i for i, layer in enumerate(layers) if i not in rings and not layer.homes.has_room(layer.length, 1)]
        generic = sorted(rings + full[:1])  # the first full layer's update grows every layer's homes
        actual = fused.step(token, in_place_cache)
        assert torch.equal(actual, expected), step
        assert updates == generic  # every other layer wrote in place
        grown += len(generic) > 0 and policy is not None
        token = int(actual.argmax())
    assert grown == (1 if policy is not None else 0)
    assert len(rows) == 6 * len(in_place_cache.kv_layers)
    assert in_place_cache.get_seq_length() == generic_cache.get_seq_length() == prompt + 6
    for layer in heads:
        (generic, positions), (in_place, in_place_positions) = probes[0].queries(layer), probes[1].queries(layer)
        assert positions == in_place_positions == list(range(prompt, prompt + 6)) and torch.equal(in_place, generic)
    # the homes hold the same K/V, token for token (rings: the tokens they still hold)
    for generic, in_place in zip(generic_cache.kv_layers, in_place_cache.kv_layers):
        oldest = generic.homes.oldest(generic.length)
        for a, b in zip(generic.homes, in_place.homes):
            assert torch.equal(a.block(oldest, generic.length), b.block(oldest, in_place.length))


@needs_kernel
@torch.inference_mode()
def test_a_fused_step_on_8_bit_homes_matches_the_forward_on_the_same_cache():
    # the step uses the cache's own update and attend: the homes' format is the cache's business
    model, fused, stock_cache, fused_cache = _read_twice("qwen2-gqa-bias", 3, 200, OffloadPolicy(kv_dtype="int8"))
    assert all(home.is_quantized for layer in fused_cache.kv_layers for home in layer.homes)
    for token in (5, 17, 250):
        expected = model(torch.tensor([[token]]), past_key_values=stock_cache, use_cache=True).logits[0, -1]
        assert rel_diff(fused.step(token, fused_cache), expected) < RTOL


@needs_kernel
@torch.inference_mode()
def test_a_stop_between_layers_raises_and_the_step_runs_again_whole():
    _, fused, cache, reference = _read_twice("llama-gqa", 5, 80)
    checks = []

    def stop_before_the_second_layer() -> bool:
        checks.append(1)
        return len(checks) == 2

    with pytest.raises(ForwardInterrupted, match="layer 1"):
        fused.step(7, cache, stop_before_the_second_layer)
    assert cache.layers[0].get_seq_length() == 81 and cache.layers[1].get_seq_length() == 80
    cache.crop_to(80)  # what the session's give-back does after a stopped forward
    route.clear()
    expected = fused.step(7, reference)
    assert torch.equal(fused.step(7, cache), expected)


def test_models_of_another_form_keep_their_own_forward(monkeypatch):
    dense = AutoModelForCausalLM.from_config(LlamaConfig(**_TINY)).eval()
    assert FusedDecode.for_model(dense) is None  # dense projections
    assert fused_decode._why_not(dense) == "projections not all GGUF blocks"
    from transformers import Gemma3TextConfig, Olmo2Config
    olmo2 = blocked(Olmo2Config(**_TINY))  # norms after attention and MLP, q/k norms over all heads
    assert FusedDecode.for_model(olmo2) is None
    gelu = blocked(LlamaConfig(**_TINY, hidden_act="gelu"))
    assert fused_decode._why_not(gelu) == "activation gelu"
    assert fused_decode._why_not(blocked(Gemma3TextConfig(**_TINY, head_dim=64))).startswith("model type")
    if gguf_blocks.kernel() is not None:
        monkeypatch.setattr(gguf_blocks, "kernel", lambda: None)
        assert fused_decode._why_not(blocked(CONFIGS["llama-gqa"])) == "no C kernel"


@pytest.fixture(scope="module")
def gguf_smollm2():
    """The embedded SmolLM2 Q4_1 GGUF (Q8_0 lm_head) on its own blocks, head-wise attention."""
    return load_model(str(_embedded_gguf()), device="cpu", weights="gguf")


@pytest.mark.slow
@needs_kernel
@torch.inference_mode()
def test_real_smollm2_gguf_decodes_fused_token_for_token_with_stock_on_the_same_file(smollm2_dir, gguf_smollm2):
    """Read 1,024 tokens through the model's forward, then greedy decode with the fused step, against stock
    transformers on the file dequantized (the converted folder)."""
    from smollm2_runs import real_text

    model, tokenizer = gguf_smollm2
    fused = FusedDecode.for_model(model)
    assert fused is not None
    stock = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    ids = torch.tensor([tokenizer(real_text(), add_special_tokens=False)["input_ids"][:1024]])
    expected = stock.generate(ids, max_new_tokens=24, do_sample=False, output_logits=True,
                              return_dict_in_generate=True)
    cache = engine.HeadInferCache(model.config, resident_slots=0, chunk_size=256)
    logits = None
    for begin in range(0, ids.shape[1], 256):
        logits = model(ids[:, begin : begin + 256], past_key_values=cache, use_cache=True).logits[0, -1]
    tokens = []
    for step, reference in enumerate(expected.logits):
        assert rel_diff(logits, reference[0]) < 10 * RTOL, step
        tokens.append(int(logits.argmax()))
        logits = fused.step(tokens[-1], cache)
    assert tokens == expected.sequences[0, ids.shape[1]:].tolist()


@needs_kernel
def test_a_session_answers_through_the_fused_step_as_through_the_forward(gguf_smollm2, monkeypatch):
    """The app's path: ``DocumentSession.ask`` decodes with the fused step, and its answer is the one the model's
    own forward gives; a stop mid-answer still leaves the cache holding exactly the tokens it says."""
    from smollm2_runs import real_text

    model, tokenizer = gguf_smollm2
    calls = []
    step = FusedDecode.step
    monkeypatch.setattr(FusedDecode, "step", lambda self, *a, **k: calls.append(1) or step(self, *a, **k))
    answers = []
    document = real_text()[:3000]
    for fused in (True, False):
        session = engine.DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=256))
        assert session._fused is not None
        if not fused:
            session._fused = None  # the model's own forward for every step
        session.set_document(document)
        session.prefill()
        answers.append(list(session.ask("What is this text about?", max_new_tokens=16, sources=False))[-1].text)
    assert len(calls) >= 15 and answers[0] == answers[1] and answers[0].strip()
    checks = []

    def should_stop() -> bool:  # true within the third fused step, before its eleventh layer
        if len(calls) < 3 + 16:
            return False
        checks.append(1)
        return len(checks) > 10

    session = engine.DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=256))
    session.set_document(document)
    session.prefill()
    last = list(session.ask("What is this text about?", max_new_tokens=16, should_stop=should_stop,
                            sources=False))[-1]
    assert last.stopped and last.num_tokens == 3
    assert session.cache.get_seq_length() == len(session._cached_ids)
    assert all(layer.get_seq_length() == len(session._cached_ids) for layer in session.cache.kv_layers)
