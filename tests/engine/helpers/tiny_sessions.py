"""The snapshot and store tests' tiny setting: a random tiny Llama with a word-level tokenizer (one token a word), random
word documents, sessions on them (read or not, on the disk tier or not) and the bytes of their K/V."""

from __future__ import annotations

import random
from pathlib import Path

import torch
from archs import tiny_configs
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from engine import DocumentSession, OffloadPolicy
from engine.store.format import read_header

VOCAB = tiny_configs()["llama-gqa"].vocab_size


def word_tokenizer(order: list[int] | None = None) -> PreTrainedTokenizerFast:
    """Words ``w0``..``w96`` -> ids; ``order`` permutes the mapping (another tokenizer, same vocabulary)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    order = order or list(range(VOCAB))
    raw = Tokenizer(models.WordLevel({f"w{i}": order[i] for i in range(VOCAB)}, unk_token="w0"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="w0", eos_token="w1")


def tiny_model(folder: Path, *, seed: int = 1234, dtype=torch.float32):
    """A random tiny Llama (GQA) saved in ``folder`` and loaded back with head-wise attention."""
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(tiny_configs()["llama-gqa"]).save_pretrained(folder)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="headinfer").eval()


def words_text(seed: int, words: int = 150) -> str:
    """A document of ``words`` random words of ``word_tokenizer``'s vocabulary (one token each)."""
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(2, VOCAB)}" for _ in range(words))


def open_session(model, tokenizer, text: str, **policy) -> DocumentSession:
    """A session on ``text`` in chunks of 64, not read yet."""
    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=64, **policy), answer_budget=32)
    session.set_document(text)
    return session


def prefilled_session(model, tokenizer, text: str, **policy) -> DocumentSession:
    session = open_session(model, tokenizer, text, **policy)
    session.prefill()
    return session


def answer_text(session: DocumentSession, question: str = "w3 w4 w5", max_new_tokens: int = 8) -> str:
    """The answer's text, the conversation cleared after it."""
    *_, last = session.ask(question, max_new_tokens=max_new_tokens)
    session.new_conversation()
    return last.text


def head_kv_bytes(session: DocumentSession) -> list[torch.Tensor]:
    """Every (layer, head) K/V of the document as raw bytes, independent of the head grouping."""
    cache, n = session.cache, session.document_tokens
    return [home.block(0, n)[:, :, :, i].contiguous().view(torch.uint8).reshape(-1).clone()
            for layer in cache.kv_layers for home in layer.homes for i in range(home.group.size)]


def tier_policy(model, tokenizer, text: str, tmp_path, **policy) -> dict:
    """Policy fields that put about three quarters of the document's KV homes on the disk tier."""
    probe = open_session(model, tokenizer, text, **policy)
    probe.prefill()
    plan, kv = probe.cache.plan, probe.cache.kv_bytes()["host"]
    probe.clear()
    return dict(policy, disk_dir=str(tmp_path / "tier"), host_memory=plan.host_bytes - kv * 3 // 4)


def tier_session(model, tokenizer, text, tmp_path, **policy) -> DocumentSession:
    """``text`` read with most of its homes on the disk tier (in ``tmp_path``)."""
    session = open_session(model, tokenizer, text, **tier_policy(model, tokenizer, text, tmp_path, **policy))
    session.prefill()
    assert session.cache.plan.disk_slots > 0 and session.cache.kv_bytes()["disk"] > 0
    return session


def home_files(folder):
    """A saved folder's header and the files of its homes linked from the disk tier."""
    header = read_header(folder)
    return header, [f for f in header.files if f.is_home]
