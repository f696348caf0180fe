"""The self-check as the app sees it: ``launch.py --self-check``, first use on a GPU only, the header's line."""

from __future__ import annotations

import json
import logging
import types

import pytest

import launch
from app import cli, startup
from app import render


def test_the_header_shows_the_self_check_line():
    ok = render.model_header({"name_or_path": "m", "self_check": "exact on this GPU ✓ 2026-11-23"})
    assert 'class="self-check" data-ok="True"' in ok and "exact on this GPU ✓ 2026-11-23" in ok
    failed = render.model_header({"name_or_path": "m", "self_check": "self-check 2026-11-23: kv8 wrong, turned off"})
    assert 'data-ok="False"' in failed
    assert "self-check" not in render.model_header({"name_or_path": "m"})


def test_a_cpu_start_up_runs_no_self_check_and_keeps_the_policy():
    policy = startup.make_policy(cli.build_parser().parse_args(["--kv-8bit", "int8"]))
    assert startup.apply_first_use_self_check(policy, "cpu") == (policy, None)


def test_on_a_gpu_the_failed_features_of_the_report_are_turned_off(monkeypatch, caplog):
    from engine import selfcheck  # the package launch.py calls (its public names)

    report = types.SimpleNamespace(failed=["kv8"], status_line=lambda: "self-check: kv8 wrong, turned off")
    monkeypatch.setattr(selfcheck, "first_use", lambda policy, device, weights="dense": report)
    policy = startup.make_policy(cli.build_parser().parse_args(["--kv-8bit", "int8"]))
    with caplog.at_level(logging.WARNING, logger="engine.selfcheck.report"):
        safe, line = startup.apply_first_use_self_check(policy, "cuda")
    assert safe.kv_dtype is None and line == "self-check: kv8 wrong, turned off"
    assert "8-bit KV" in caplog.text


def test_self_check_flag_runs_the_check_and_exits_with_its_status(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADINFER_CACHE", str(tmp_path))
    with pytest.raises(SystemExit) as exit_:
        launch.main(["--self-check", "--host-attention", "off"])  # neither the model nor the port is needed
    assert exit_.value.code == 0
    report = json.loads(next((tmp_path / "self-check").glob("*.json")).read_text())
    assert report["failed"] == [] and report["identity"]["features"] == ["overlap"]
    assert startup.self_check.__doc__ and "--self-check" in cli.build_parser().format_help()


def test_a_self_check_that_cannot_run_is_said_in_the_header(monkeypatch, caplog):
    from engine import selfcheck  # the package launch.py calls (its public names)

    def broken(policy, device, weights="dense"):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(selfcheck, "first_use", broken)
    policy = startup.make_policy(cli.build_parser().parse_args([]))
    with caplog.at_level(logging.WARNING, logger="headinfer.launch"):
        assert startup.apply_first_use_self_check(policy, "cuda") == (policy, "not self-checked on this GPU")
    assert "could not run" in caplog.text


def test_the_header_names_quantized_weights_and_says_when_they_are_lossy():
    from engine.models.quantized import label

    gguf = render.model_header({"name_or_path": "m", "weights": "gguf", "weights_label": label("gguf")})
    assert 'class="lossy">GGUF blocks (exact to the GGUF file; a lossy copy of the bf16 model)' in gguf
    int8 = render.model_header({"name_or_path": "m", "weights": "int8", "weights_label": label("int8")})
    assert 'class="lossy">int8 weights (' in int8 and "a lossy copy" in int8
    dense = render.model_header({"name_or_path": "m", "weights": "dense"})
    assert "GGUF" not in dense and "int8" not in dense
