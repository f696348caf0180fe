"""Shared fixtures for the engine tests: the embedded SmolLM2 model, converted and loaded once per session."""

import pytest


@pytest.fixture(scope="session")
def smollm2_dir():
    """Folder of the embedded SmolLM2-135M-Instruct (safetensors + tokenizer); converted on first use."""
    from engine.models.loader import embedded_model_dir

    return embedded_model_dir()


@pytest.fixture(scope="session")
def smollm2(smollm2_dir):
    """``(model, tokenizer)`` of the embedded model on CPU in float32, with stock ``sdpa`` attention."""
    from engine.models.loader import load_model

    return load_model(str(smollm2_dir), device="cpu", attn_implementation="sdpa")


@pytest.fixture(scope="module")
def headinfer_smollm2(smollm2):
    """``smollm2`` running head-wise attention for one test module (stock ``sdpa`` again afterwards)."""
    model, tokenizer = smollm2
    model.set_attn_implementation("headinfer")
    yield model, tokenizer
    model.set_attn_implementation("sdpa")


@pytest.fixture
def own_lock(tmp_path, monkeypatch):
    """This test's own revision lock (``engine.models.hub_lock``, under ``HEADINFER_CACHE``): the fake Hub serves
    other files under the same commit from one test to the next, which a shared lock would rightly refuse."""
    monkeypatch.setenv("HEADINFER_CACHE", str(tmp_path / "studio-cache"))
    from engine.models.hub_lock import lock_path

    return lock_path()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """``(model, tokenizer)``: a random tiny Llama and its word-level tokenizer (tests/engine/helpers/tiny_sessions.py),
    one per test module."""
    from tiny_sessions import tiny_model, word_tokenizer

    return tiny_model(tmp_path_factory.mktemp("tiny")), word_tokenizer()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """``(folder, model, tokenizer)``: ``tiny``'s model with the folder it is saved in (a child process loads it)."""
    from tiny_sessions import tiny_model, word_tokenizer

    folder = tmp_path_factory.mktemp("tiny-checkpoint")
    return folder, tiny_model(folder), word_tokenizer()
