"""The header names a quantized model's weights as the engine labels them (``describe(model)["weights_label"]``):
lossy where torchao or bitsandbytes quantized them, as published for a checkpoint shipped quantized; escaped."""

from __future__ import annotations

from app import render


def test_a_library_quantized_model_is_said_to_be_a_lossy_copy():
    label = "4-bit weights (bitsandbytes nf4, blocks of 64; a lossy copy of the bf16 weights)"
    header = render.model_header({"name_or_path": "m", "weights": "bnb-nf4", "weights_label": label})
    assert f'<span class="lossy">{label}</span>' in header


def test_a_checkpoint_published_quantized_is_not_called_lossy_and_its_label_is_escaped():
    header = render.model_header({"name_or_path": "m", "weights": "prequantized:awq",
                                  "weights_label": "awq <img src=x onerror=alert(1)> weights"})
    assert '<span class="weights">awq &lt;img src=x onerror=alert(1)&gt; weights</span>' in header
    assert "<img" not in header


def test_dense_weights_add_nothing():
    assert "weights" not in render.model_header({"name_or_path": "m", "weights": "dense",
                                                 "weights_label": "bf16/fp32 weights as stored"})


def test_the_first_use_self_check_is_told_the_served_weights(monkeypatch):
    from app import cli, startup
    from engine import selfcheck

    seen = []
    monkeypatch.setattr(selfcheck, "first_use", lambda policy, device, weights="dense": seen.append(weights))
    policy = startup.make_policy(cli.build_parser().parse_args([]))
    assert startup.apply_first_use_self_check(policy, "cuda", "bnb-nf4") == (policy, None)
    assert seen == ["bnb-nf4"]
