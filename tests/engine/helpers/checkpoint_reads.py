"""A checkpointed read's test setting: sessions read in small chunks, and what a read leaves to compare with an
uninterrupted one (its K/V bytes, the logits after a question, the greedy answer), for the checkpoint, Ctrl+C and
snapshot-version tests."""

from __future__ import annotations

import torch

from engine import DocumentSession, OffloadPolicy
from engine.store.files import saved_range

WORDS = 150  # ~11 chunks of CHUNK
CHUNK = 16


def chunked_session(model, tokenizer, text: str, **policy) -> DocumentSession:
    """A session on ``text`` in chunks of ``CHUNK`` (a long read: many checkpoints), not read yet."""
    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=CHUNK, **policy), answer_budget=32)
    session.set_document(text)
    return session


def restored_kv_bytes(session: DocumentSession) -> list[torch.Tensor]:
    """Every (layer, KV head) K/V a restore needs (a windowed layer: its window) as raw bytes, whatever the head
    groups."""
    n = session.document_tokens
    return [home.block(*saved_range(layer.window, n))[:, :, :, i].contiguous().view(torch.uint8).reshape(-1).clone()
            for layer in session.cache.kv_layers for home in layer.homes for i in range(home.group.size)]


def read_outcome(session: DocumentSession) -> tuple[list[torch.Tensor], torch.Tensor, str]:
    """(the document's K/V bytes, the logits after a question, the greedy answer) of a read session."""
    kv = restored_kv_bytes(session)
    *_, last = session.ask("w3 w4 w5", max_new_tokens=8, repetition_guard=None, sources=False)
    session.new_conversation()
    logits = session._extend_to(session._document_ids + session.tokenizer("w3 w4 w5")["input_ids"]).float().clone()
    session.new_conversation()
    return kv, logits, last.text


def assert_same_read(resumed, reference) -> None:
    """Two ``read_outcome``s agree: the same K/V bytes and answer, logits within float tolerance."""
    kv, logits, text = resumed
    kv_ref, logits_ref, text_ref = reference
    assert all(torch.equal(a, b) for a, b in zip(kv, kv_ref, strict=True))
    torch.testing.assert_close(logits, logits_ref, rtol=1e-5, atol=1e-5)
    assert text == text_ref
