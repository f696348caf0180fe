"""The order a model switch takes: beside the served model where both fit, else the old one unloaded first (a 24 GiB
card cannot hold two 27B models), with the old one loaded back, or none served, when the new one fails to load.
The free memory and the loader are stood in for; the models are tiny real ones, counted alive by weak references."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from transformers import AutoModelForCausalLM

import engine  # noqa: F401  (registers the headinfer attention)
from archs import tiny_configs
from engine.errors import StateError, SwitchFailed
from engine.planning.policy import OffloadPolicy
from engine.serving import ModelHolder
from tiny_sessions import word_tokenizer, words_text

GIB = 2**30
NEW_WEIGHTS = 15 * GIB  # a 27B model at 4-bit, as the picker plans it
FREE_BESIDE = 8 * GIB  # a 24 GiB card already holding one of them


class Loader:
    """Loads a tiny random model per call (``failing``: sources that raise instead), counting the models alive at
    each load (the served one included) and what the holder served at that moment."""

    def __init__(self, failing=()):
        self.failing, self.alive, self.calls = set(failing), weakref.WeakSet(), []

    def __call__(self, source):
        gc.collect()
        self.calls.append((source, len(self.alive)))  # models alive while this one loads
        if source in self.failing:
            raise OSError(f"{source}: out of memory")
        model = AutoModelForCausalLM.from_config(tiny_configs()["llama-gqa"], attn_implementation="headinfer").eval()
        self.alive.add(model)
        return model, word_tokenizer()


def _holder(free_bytes: int, loader: Loader) -> tuple[ModelHolder, weakref.ref]:
    model, tokenizer = loader("gemma")
    loader.calls.clear()
    holder = ModelHolder(model, tokenizer, OffloadPolicy(chunk_size=64), "Gemma 4", loader=loader, source="gemma",
                         free_memory=lambda device: free_bytes)
    return holder, weakref.ref(model)


def _reading(holder: ModelHolder):
    session = holder.new_session()
    session.set_document(words_text(1, 100))
    session.prefill()
    return session


def test_a_model_that_fits_beside_loads_first_and_the_old_serves_meanwhile():
    loader = Loader()
    holder, old = _holder(40 * GIB, loader)
    session = _reading(holder)
    report = holder.switch("qwen", name="Qwen3.6-27B", weights_bytes=NEW_WEIGHTS)
    assert loader.calls == [("qwen", 1)]  # loaded while the old model was alive and served
    assert not report.unloaded_first and holder.name == "Qwen3.6-27B"
    gc.collect()
    assert old() is None and "switched from Gemma 4 to Qwen3.6-27B" in session.retired


def test_a_model_that_does_not_fit_beside_is_loaded_after_the_old_one_is_freed():
    loader = Loader()
    holder, old = _holder(FREE_BESIDE, loader)
    assert not holder.order_for(NEW_WEIGHTS).fits
    session = _reading(holder)
    report = holder.switch("qwen", name="Qwen3.6-27B", weights_bytes=NEW_WEIGHTS)
    assert loader.calls == [("qwen", 0)]  # at most one model alive at any time
    assert old() is None and report.unloaded_first and report.closed_documents == 1
    assert "Gemma 4 was unloaded to load Qwen3.6-27B" in session.retired and session.model is None
    fresh = holder.new_session()
    fresh.set_document(words_text(2, 100))
    fresh.prefill()
    assert fresh.is_prefilled and holder.serial == 2  # unloaded (1), then the new one served (2)


def test_a_failed_load_after_unloading_loads_the_old_model_back_and_tells_the_sessions():
    loader = Loader(failing={"qwen"})
    holder, _ = _holder(FREE_BESIDE, loader)
    session = _reading(holder)
    with pytest.raises(SwitchFailed, match="could not load Qwen3.6-27B: qwen: out of memory; Gemma 4 is served again"):
        holder.switch("qwen", name="Qwen3.6-27B", weights_bytes=NEW_WEIGHTS)
    assert loader.calls == [("qwen", 0), ("gemma", 0)]  # the old model from its source, nothing else alive
    assert holder.name == "Gemma 4" and holder.source == "gemma" and holder.model is not None
    assert "Gemma 4 is served again" in session.retired and session.model is None
    assert holder.new_session().model is holder.model


def test_when_both_loads_fail_no_model_is_served_and_new_sessions_say_how_to_pick_one():
    loader = Loader()
    holder, old = _holder(FREE_BESIDE, loader)
    loader.failing = {"qwen", "gemma"}  # once the served one is loaded
    session = _reading(holder)
    with pytest.raises(SwitchFailed, match="loading Gemma 4 back failed too: gemma: out of memory"):
        holder.switch("qwen", name="Qwen3.6-27B", weights_bytes=NEW_WEIGHTS)
    gc.collect()
    assert holder.model is None and old() is None and "No model is served" in session.retired
    assert "No model is served" in holder.info()["model_name"]  # the page's header says so
    with pytest.raises(StateError, match="No model is served: Qwen3.6-27B could not be loaded.*Serve this model"):
        holder.new_session()
    loader.failing.clear()  # a later pick serves again
    holder.switch("small", name="SmolLM2", weights_bytes=GIB)
    assert holder.name == "SmolLM2" and holder.new_session().model is holder.model
    assert "No model is served" not in str(holder.info().get("model_name"))


def test_the_room_is_free_memory_less_the_reserve_and_the_kv_an_unread_document_will_take():
    loader = Loader()
    holder, _ = _holder(20 * GIB, loader)
    assert holder.order_for(None).fits  # a size not known keeps today's order
    cpu_room = holder.order_for(1).room
    assert cpu_room == int(20 * GIB * 0.85)  # the host plan's share of available RAM
    session = holder.new_session()
    session.set_document(words_text(3, 100))  # planned, not allocated until its first chunk
    planned = session.cache.plan.host_bytes - session.shape.weights_bytes
    assert planned > 0 and holder.order_for(1).room == cpu_room - planned
    session.prefill()  # its homes now held, so already out of the free reading (what is left: activations)
    assert cpu_room - planned / 2 < holder.order_for(1).room < cpu_room
    holder.device = torch.device("cuda")  # a card's reading: the plan's GPU reserve comes off
    session.clear()
    assert holder.order_for(1).room == 20 * GIB - holder.policy.gpu_reserve


@pytest.mark.slow
def test_smollm2_switched_to_itself_through_an_unload_answers_as_a_fresh_load():
    from engine.models.loader import load_model
    from engine.session import DocumentSession

    document = "The lighthouse keeper's code word is saffron. " * 20
    question = "What is the keeper's code word?"

    def answer(session):
        session.set_document(document)
        session.prefill()
        last = list(session.ask(question, max_new_tokens=12, repetition_guard=None))[-1]
        return last.text, last.num_tokens, session.tokenizer(last.text).input_ids  # greedy: the same tokens

    loaded = []
    holder = ModelHolder(*load_model(None, device="cpu"), OffloadPolicy(chunk_size=64), "SmolLM2",
                         loader=lambda source: loaded.append(source) or load_model(source, device="cpu"),
                         free_memory=lambda device: 1 << 20)
    old = weakref.ref(holder.model)
    report = holder.switch(None, name="SmolLM2", weights_bytes=holder.order_for(None).room + 1)
    assert report.unloaded_first and loaded == [None] and old() is None
    switched = answer(holder.new_session())
    model, tokenizer = load_model(None, device="cpu")
    assert switched == answer(DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=64))) and switched[1] == 12
