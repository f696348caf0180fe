"""The retrieval-head calibration never competes with a read: on the CPU it runs once per model in a child process at
the lowest priority, and later starts read its result from the disk cache."""

from __future__ import annotations

import subprocess

import psutil
import pytest

from engine.answer import retrieval_heads

DEPTHS = (0.2, 0.5, 0.8)


@pytest.mark.slow
def test_on_the_cpu_the_calibration_runs_in_a_niced_child_once(headinfer_smollm2, tmp_path, monkeypatch):
    model, tokenizer = headinfer_smollm2
    children = []
    popen = subprocess.Popen

    def spy(*args, **kwargs):
        child = popen(*args, **kwargs)  # returns once the child has exec'd: its priority is set by then
        children.append(psutil.Process(child.pid).nice())
        return child

    def in_this_process(*args, **kwargs):
        raise AssertionError("the calibration ran in the serving process")

    monkeypatch.setattr(retrieval_heads.subprocess, "Popen", spy)
    with monkeypatch.context() as patch:
        patch.setattr(retrieval_heads, "_needle_scores", in_this_process)
        heads = retrieval_heads._find(model, tokenizer, 8, 60, DEPTHS, tmp_path)
        assert children == [19]
        assert retrieval_heads.cached_heads_path(model, 8, tmp_path).is_file()
        assert retrieval_heads._find(model, tokenizer, 8, 60, DEPTHS, tmp_path) == heads  # the disk cache
        assert len(children) == 1
    assert retrieval_heads._find(model, tokenizer, 8, 60, DEPTHS, None) == heads  # in-process: the same heads
    assert sum(len(h) for h in heads.values()) == 8


def test_a_model_load_model_did_not_return_calibrates_in_process(tmp_path, monkeypatch):
    """No way to load it again in a child: the calibration stays in the caller's process, as on a GPU."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from archs import _COMMON
    from engine.models.weights_mode import loaded_as

    model = AutoModelForCausalLM.from_config(LlamaConfig(**_COMMON), attn_implementation="headinfer").eval()
    assert loaded_as(model) is None

    def no_child(*args, **kwargs):
        raise AssertionError("a child was started")

    monkeypatch.setattr(retrieval_heads.subprocess, "Popen", no_child)
    monkeypatch.setattr(retrieval_heads, "_needle_scores",
                        lambda *args, **kwargs: torch.rand(_COMMON["num_hidden_layers"], _COMMON["num_attention_heads"],
                                                           dtype=torch.float64))
    heads = retrieval_heads._find(model, _Tokenizer(), 4, 10, DEPTHS, tmp_path)
    assert sum(len(h) for h in heads.values()) == 4
    assert retrieval_heads.cached_heads_path(model, 4, tmp_path).is_file()


class _Tokenizer:
    pass
