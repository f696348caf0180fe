"""Out of memory anyway: an allocation refused at the ledger's allocation point mid-forward leaves the cache as it
was, the message names what to change, and the next question works."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import engine
from archs import tiny_configs
from engine.kv.ledger import AllocationRefused
from engine.planning.out_of_memory import out_of_memory_message


def test_message_names_what_to_change_and_what_is_kept():
    error = AllocationRefused("homes", 2**30, "cuda")
    message = out_of_memory_message(12, "cuda", error)
    assert "kept" in message and "--gpu-memory" in message and "homes" in message
    assert "--host-memory" in out_of_memory_message(12, "cpu", torch.OutOfMemoryError("x"))


def test_conversation_survives_a_refused_allocation_and_the_next_question_works():
    """Through the session's forward: the document and the first turn stay, the message names what to change,
    and the failed question asked again answers as if nothing happened."""
    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(tiny_configs()["llama-gqa"], attn_implementation="headinfer").eval()
    ids = torch.randint(0, 97, (48,), generator=torch.Generator().manual_seed(2)).tolist()
    document, turn1, turn2 = ids[:32], ids[32:36], ids[36:44]

    def session():  # 8-bit on a CPU: short steps attend on the host, whose buffers grow with the step's tokens
        s = engine.DocumentSession.__new__(engine.DocumentSession)
        s.model, s.device, s._cached_ids = model, torch.device("cpu"), []
        s.cache = engine.HeadInferCache(model.config, device="cpu", kv_dtype="int8", max_context=64, chunk_size=32)
        s._forward(document)
        s._forward(turn1)  # 4 tokens: the host buffers are made for 4
        return s

    expected = session()._forward(turn2)
    victim = session()
    victim.cache.ledger.inject("host_io")  # the 8-token step must grow them: refused
    with pytest.raises(MemoryError, match="The document and the conversation are kept") as raised:
        victim._forward(turn2)
    assert "--host-memory" in str(raised.value) and "host_io" in str(raised.value)
    assert victim._cached_ids == document + turn1 and victim.cache.get_seq_length() == 36
    assert torch.equal(victim._forward(turn2), expected)


@torch.inference_mode()
def test_refused_allocation_mid_decode_leaves_the_cache_usable():
    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(tiny_configs()["llama-gqa"], attn_implementation="headinfer").eval()
    ids = torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(2))

    def cache():  # 8-bit on a CPU: decode attends on the host, whose buffers are allocated at the first short step
        return engine.HeadInferCache(model.config, device="cpu", kv_dtype="int8", max_context=64, chunk_size=32)

    reference = cache()
    model(ids[:, :32], past_key_values=reference)
    model(ids[:, 32:], past_key_values=reference)  # 8 tokens: a host step
    expected = model(ids[:, :1], past_key_values=reference).logits

    victim = cache()
    model(ids[:, :32], past_key_values=victim)
    victim.ledger.inject("host_io")
    with pytest.raises(torch.OutOfMemoryError):
        model(ids[:, 32:], past_key_values=victim)
    victim.crop_to(32)  # what the session does: the chunk is given back
    model(ids[:, 32:], past_key_values=victim)
    assert torch.equal(model(ids[:, :1], past_key_values=victim).logits, expected)
