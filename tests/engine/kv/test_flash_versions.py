"""flash-attn is used only where its version computes what we ask (faked modules: no GPU, no flash-attn needed)."""

from __future__ import annotations

import logging
import sys
import types

import pytest
import torch

from engine.kv import kernels

CUDA_BF16 = types.SimpleNamespace(is_cuda=True, dtype=torch.bfloat16)  # what _can_flash reads of a query


@pytest.fixture
def flash_version(monkeypatch):
    """Installs a fake ``flash_attn`` of a given version; the selection's cache is cleared around each test."""

    def install(version: str):
        module = types.ModuleType("flash_attn")
        module.__version__ = version
        module.flash_attn_func = lambda *args, **kwargs: None
        monkeypatch.setitem(sys.modules, "flash_attn", module)
        kernels._flash_attn.cache_clear()
        kernels._flash_skipped.cache_clear()

    yield install
    kernels._flash_attn.cache_clear()
    kernels._flash_skipped.cache_clear()


def test_before_2_1_flash_attn_is_never_used_its_causal_mask_is_top_left(flash_version, caplog):
    flash_version("2.0.9")
    with caplog.at_level(logging.WARNING, logger="engine.kv.kernels"):
        assert not kernels._can_flash(CUDA_BF16, k_len=100, window=None, softcap=None)
    assert "top-left" in caplog.text


@pytest.mark.parametrize("version, window_ok, softcap_ok", [
    ("2.2.5", False, False), ("2.3.0", True, False), ("2.5.9.post1", True, False), ("2.6.0", True, True),
    ("2.7.4.post1", True, True), ("3.0.0b1", True, True)])
def test_window_needs_2_3_and_softcap_2_6_other_calls_run_on_any_2_1_plus(flash_version, caplog, version,
                                                                         window_ok, softcap_ok):
    flash_version(version)
    with caplog.at_level(logging.INFO, logger="engine.kv.kernels"):
        assert kernels._can_flash(CUDA_BF16, k_len=100, window=None, softcap=None)
        assert kernels._can_flash(CUDA_BF16, k_len=100, window=100, softcap=None)  # the window hides nothing
        assert kernels._can_flash(CUDA_BF16, k_len=100, window=64, softcap=None) == window_ok
        assert kernels._can_flash(CUDA_BF16, k_len=100, window=None, softcap=50.0) == softcap_ok
    if not window_ok:
        assert "no window_size" in caplog.text
    if not softcap_ok:
        assert "no softcap" in caplog.text


def test_flash_attn_is_only_for_half_precision_on_cuda(flash_version):
    flash_version("2.7.0")
    assert not kernels._can_flash(types.SimpleNamespace(is_cuda=True, dtype=torch.float32), 10, None, None)
    assert not kernels._can_flash(types.SimpleNamespace(is_cuda=False, dtype=torch.bfloat16), 10, None, None)


def test_without_flash_attn_sdpa_runs(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # import raises ImportError
    kernels._flash_attn.cache_clear()
    try:
        assert not kernels._can_flash(CUDA_BF16, k_len=10, window=None, softcap=None)
    finally:
        kernels._flash_attn.cache_clear()
