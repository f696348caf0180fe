"""Models already on this machine, in the on-disk layouts of Ollama and LM Studio, read from GGUF headers only.

The layouts follow the tools' own documentation and source: Ollama keeps ``manifests/<host>/<namespace>/<model>/<tag>``
JSON manifests whose ``application/vnd.ollama.image.model`` layer names a blob ``blobs/sha256-<digest>`` (a blob
still downloading is ``sha256-<digest>-partial`` with ``-partial-N`` part files, renamed once complete, and the
manifest is written last); LM Studio keeps ``models/<publisher>/<model>/<file>.gguf`` under ``~/.lmstudio`` (before:
``~/.cache/lm-studio``). Neither tool can be installed here, so the stores are built by hand around real GGUF bytes:
the embedded SmolLM2's file and tiny ones written with the ``gguf`` package.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

import engine.models.discovery as discovery
from engine.models.catalogue import Machine, plan_entry
from engine.models.discovery import default_folders, discover, gguf_entry
from engine.errors import GGUFHeaderError
from engine.models.gguf_header import read_header
from model_stores import OllamaStore, link, write_gguf

GIB = 2**30
CPU_ONLY = Machine("CPU", False, None, 16 * GIB, None, 2e10, 5.0, None, 4)
SMOLLM2 = {"model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
           "head_dim": 64, "hidden_size": 576, "intermediate_size": 1536, "max_position_embeddings": 8192,
           "vocab_size": 49152}
SMOLLM2_PARAMS = 134_515_008  # the tensor table's elements, as gguf.GGUFReader counts them


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    from engine.models.loader import _embedded_gguf

    return _embedded_gguf()


def test_the_header_reader_agrees_with_gguf_reader_and_knows_a_file_cut_short(tmp_path):
    from gguf import GGUFReader

    path = write_gguf(tmp_path / "tiny.gguf", tensors=3, license_="mit")
    header, reader = read_header(path), GGUFReader(str(path))
    assert header.num_params == sum(int(t.n_elements) for t in reader.tensors) == 3 * 50 * 256
    assert header.data_offset == reader.data_offset and header.is_complete
    assert header.data_offset + header.data_bytes == path.stat().st_size
    assert header.fields["llama.block_count"] == 3 and header.fields["general.license"] == "mit"
    assert header.fields["tokenizer.ggml.tokens"] == 50  # a vocabulary is counted, not read

    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:-1000])  # the tensor data is short: a download in progress
    assert not read_header(cut).is_complete and gguf_entry(cut, "cut", "folder") is None
    short = tmp_path / "short.gguf"
    short.write_bytes(path.read_bytes()[:200])  # the header itself is cut
    with pytest.raises(GGUFHeaderError, match="cut short"):
        read_header(short)
    (tmp_path / "text.gguf").write_text("not a model, only some text long enough for a header")
    with pytest.raises(GGUFHeaderError, match="not a GGUF"):
        read_header(tmp_path / "text.gguf")


def test_an_ollama_store_lists_its_models_as_ollama_names_them(tmp_path, monkeypatch, smollm2_gguf):
    store = OllamaStore(tmp_path / "ollama-models")
    store.pull("smollm2:135m", smollm2_gguf)
    store.pull("smollm2:latest", smollm2_gguf)  # a second tag of the same blob
    tiny = write_gguf(tmp_path / "src" / "tiny.gguf", arch="qwen2", context=32768)
    store.pull("tiny:q8_0", tiny, namespace="someone")
    store.pull("SmolLM2-GGUF:Q4_1", tiny, host="hf.co", namespace="bartowski")
    # Not models: a manifest with no model layer, one whose blob is still downloading (only ``-partial`` files),
    # one whose blob has another size than its manifest says, one with a LoRA adapter, and one that is not JSON.
    store.pull("embed-template:latest", None)
    pending = write_gguf(tmp_path / "src" / "pending.gguf", layers=5)
    digest = "sha256-" + hashlib.sha256(pending.read_bytes()).hexdigest()
    link(pending, store.root / "blobs" / f"{digest}-partial")
    (store.root / "blobs" / f"{digest}-partial-0").write_text('{"N": 0, "Offset": 0, "Size": 10, "Completed": 5}')
    manifest = store.pull("pending:latest", pending)
    (store.root / "blobs" / digest).unlink()  # as during a pull: the partial file exists, the blob does not yet
    store.pull("resized:latest", tiny, model_size=123)
    store.pull("tuned:latest", tiny, adapter=b"GGUF a LoRA adapter")
    (store.root / "manifests" / "registry.ollama.ai" / "library" / "broken").mkdir()
    (store.root / "manifests" / "registry.ollama.ai" / "library" / "broken" / "latest").write_text("{not json")
    assert manifest.is_file()

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OLLAMA_MODELS", str(store.root))
    assert default_folders()["Ollama"] == [store.root]  # OLLAMA_MODELS replaces the default folders
    found = {e.id: e for e in discover(hf_cache=tmp_path / "no-hub-cache")}
    assert set(found) == {"smollm2:135m", "smollm2:latest", "someone/tiny:q8_0", "hf.co/bartowski/SmolLM2-GGUF:Q4_1"}
    smollm2 = found["smollm2:135m"]
    assert smollm2.source == "Ollama" and Path(smollm2.location).name.startswith("sha256-")
    assert {k: smollm2.config[k] for k in SMOLLM2} == SMOLLM2  # the config the planner sizes it by
    assert smollm2.params == SMOLLM2_PARAMS and smollm2.license == "apache-2.0"
    assert smollm2.download_gb == round(smollm2_gguf.stat().st_size / 1e9, 2)
    fit = plan_entry(smollm2, CPU_ONLY)
    assert fit.supported and fit.window == 8192 and fit.reads_tokens == 8192
    assert found["someone/tiny:q8_0"].config["model_type"] == "qwen2"
    assert plan_entry(found["someone/tiny:q8_0"], CPU_ONLY).window == 32768


def test_lm_studio_folders_old_and_new_with_quantizations_splits_projectors_and_downloads(tmp_path, smollm2_gguf):
    models, old = tmp_path / ".lmstudio" / "models", tmp_path / ".cache" / "lm-studio" / "models"
    link(smollm2_gguf, models / "lmstudio-community" / "SmolLM2-135M-Instruct-GGUF" / "SmolLM2-135M-Instruct-Q4_1.gguf")
    write_gguf(models / "lmstudio-community" / "SmolLM2-135M-Instruct-GGUF" / "mmproj-model-f16.gguf", arch="clip")
    quants = models / "bartowski" / "Tiny-GGUF"
    write_gguf(quants / "Tiny-Q4_K_M.gguf")
    write_gguf(quants / "Tiny-Q8_0.gguf")
    split = models / "unsloth" / "Big-GGUF"
    write_gguf(split / "Big-Q4_K_M-00001-of-00002.gguf", layers=40, tensors=2)
    write_gguf(split / "Big-Q4_K_M-00002-of-00002.gguf", layers=40, tensors=3)
    lost = models / "unsloth" / "Lost-GGUF"
    write_gguf(lost / "Lost-00001-of-00002.gguf")  # its second part is not there
    cut = models / "someone" / "Cut-GGUF" / "Cut-Q4_0.gguf"
    cut.parent.mkdir(parents=True)
    cut.write_bytes(smollm2_gguf.read_bytes()[: 8 << 20])  # a download stopped 8 MiB in
    write_gguf(models / "someone" / "Hidden-GGUF" / ".Hidden.gguf")
    write_gguf(old / "TheBloke" / "Old-GGUF" / "old.Q4_0.gguf", context=4096)

    listed = discover(hf_cache=tmp_path / "no-hub-cache", folders={"LM Studio": [models, old]})
    found = {e.id: e for e in listed}
    assert set(found) == {"lmstudio-community/SmolLM2-135M-Instruct-GGUF", "bartowski/Tiny-GGUF/Tiny-Q4_K_M",
                          "bartowski/Tiny-GGUF/Tiny-Q8_0", "unsloth/Big-GGUF", "TheBloke/Old-GGUF"}
    smollm2 = found["lmstudio-community/SmolLM2-135M-Instruct-GGUF"]
    assert {k: smollm2.config[k] for k in SMOLLM2} == SMOLLM2 and smollm2.params == SMOLLM2_PARAMS
    assert all(e.source == "LM Studio" for e in listed)
    big = found["unsloth/Big-GGUF"]
    assert big.params == 5 * 50 * 256 and big.config["num_hidden_layers"] == 40  # both parts counted
    assert big.location.endswith("-00001-of-00002.gguf")
    assert plan_entry(found["TheBloke/Old-GGUF"], CPU_ONLY).window == 4096


def test_missing_unreadable_and_looping_folders_are_skipped(tmp_path, monkeypatch, caplog):
    good = write_gguf(tmp_path / "lms" / "pub" / "Good-GGUF" / "good.gguf")
    locked = tmp_path / "lms" / "pub" / "Locked-GGUF"
    write_gguf(locked / "locked.gguf")
    (tmp_path / "lms" / "pub" / "loop").symlink_to(tmp_path / "lms")  # a link back up
    (tmp_path / "lms" / "pub" / "dangling.gguf").symlink_to(tmp_path / "nowhere.gguf")
    (tmp_path / "not-a-folder").write_text("x")
    ollama = tmp_path / "ollama"
    (ollama / "manifests").mkdir(parents=True)
    (ollama / "manifests" / "registry.ollama.ai").write_text("a file where a folder belongs")

    real_scandir = os.scandir

    def scandir(path=".", *args):  # as for a folder of another user, which root here cannot be made to meet
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path, *args)

    monkeypatch.setattr(os, "scandir", scandir)
    caplog.set_level("INFO", logger=discovery.__name__)
    listed = discover([tmp_path / "missing", tmp_path / "not-a-folder", good],
                      hf_cache=tmp_path / "no-hub-cache",
                      folders={"LM Studio": [tmp_path / "lms", tmp_path / "absent"], "Ollama": [ollama, tmp_path]})
    assert sorted((e.id, e.source) for e in listed) == [("good", "folder"), ("pub/Good-GGUF", "LM Studio")]
    assert "Permission denied" in caplog.text


def test_a_gguf_repository_in_the_hugging_face_cache_is_listed_per_file(tmp_path, smollm2_gguf):
    """``hf download bartowski/SmolLM2-135M-Instruct-GGUF`` leaves snapshot links to blobs, and no config.json."""
    repo = tmp_path / "hub" / "models--bartowski--SmolLM2-135M-Instruct-GGUF"
    blob = link(smollm2_gguf, repo / "blobs" / hashlib.sha256(b"q4_1").hexdigest())
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "SmolLM2-135M-Instruct-Q4_1.gguf").symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    found = discover(hf_cache=tmp_path / "hub", folders={})
    assert [(e.id, e.source) for e in found] == [
        ("bartowski/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct-Q4_1", "Hugging Face cache")]
    assert found[0].params == SMOLLM2_PARAMS and plan_entry(found[0], CPU_ONLY).window == 8192
