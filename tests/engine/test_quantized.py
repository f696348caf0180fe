"""The quantized weights modes' arithmetic and choices (engine.models.quantized): bytes per weight, the auto rule on
a GPU, which library a mode resolves to, and the refusals. Numbers only: nothing is loaded here."""

from __future__ import annotations

import pytest
from transformers import Qwen3Config, Qwen3MoeConfig

from engine.errors import InputError
from engine.models import quantized
from engine.models.quantized import (
    bytes_per_weight,
    choose_gpu_weights,
    fused_experts_params,
    held_weight_bytes,
    kept_dense_params,
    label,
    resolve,
)

GIB = 1 << 30


def test_bytes_per_weight_of_each_mode():
    assert bytes_per_weight("dense") == 2.0 and bytes_per_weight("dense", dtype_bytes=4) == 4.0
    assert bytes_per_weight("8bit") == 1.0
    assert bytes_per_weight("4bit", "cuda") == pytest.approx(0.5625)  # nf4: a fp32 absmax per 64 weights
    assert bytes_per_weight("4bit", "cpu") == pytest.approx(0.5625)
    assert bytes_per_weight("torchao-int4") == pytest.approx(0.53125)  # a bf16 scale and zero a group of 128
    assert bytes_per_weight("int8") == 1.0
    assert bytes_per_weight("gguf") is None


def test_held_bytes_keep_the_embeddings_dense():
    # 27B weights, 1.5B of them embeddings: 4-bit holds 25.5e9 x 0.5625 + 1.5e9 x 2 bytes.
    assert held_weight_bytes("dense", 27_000_000_000, 1_500_000_000) == 54_000_000_000
    assert held_weight_bytes("4bit", 27_000_000_000, 1_500_000_000) == int(25.5e9 * 0.5625 + 3e9)
    with pytest.raises(InputError, match="file's size"):
        held_weight_bytes("gguf", 10, 0)


def test_kept_dense_counts_embeddings_and_the_fused_experts_apart():
    common = dict(hidden_size=64, vocab_size=100, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)
    assert kept_dense_params(Qwen3Config(**common, intermediate_size=96, tie_word_embeddings=True)) == 6_400
    assert kept_dense_params(Qwen3Config(**common, intermediate_size=96, tie_word_embeddings=False)) == 12_800
    assert fused_experts_params(Qwen3Config(**common, intermediate_size=96)) == 0
    moe = Qwen3MoeConfig(**common, intermediate_size=96, num_experts=4, moe_intermediate_size=32,
                         tie_word_embeddings=False, mlp_only_layers=[1])
    assert kept_dense_params(moe) == 12_800
    assert fused_experts_params(moe) == 2 * 4 * 3 * 64 * 32  # the MoE layers' experts, not the dense layer's MLP


def test_the_fused_experts_are_held_in_nf4_at_4_bit_and_dense_at_8_bit():
    params, kept, experts = 30_000_000_000, 1_000_000_000, 27_000_000_000
    assert held_weight_bytes("4bit", params, kept, experts=experts) == int(29e9 * 0.5625 + 2e9)
    assert held_weight_bytes("bnb-nf4", params, kept, experts=experts, device="cpu") == int(29e9 * 0.5625 + 2e9)
    assert held_weight_bytes("8bit", params, kept, experts=experts) == int(2e9 * 1.0 + 28e9 * 2)
    assert held_weight_bytes("torchao-int4", params, kept, experts=experts) == int(2e9 * 0.53125 + 28e9 * 2)
    assert held_weight_bytes("dense", params, kept, experts=experts) == params * 2
    budget = 24 * GIB  # 4-bit fits where the experts are quantized; 8-bit (56 GB) does not
    assert choose_gpu_weights(params, budget, working_bytes=2 * GIB, kept_dense=kept, experts=experts) == "4bit"


@pytest.mark.parametrize(("params", "expected"), [
    (7_000_000_000, "dense"),  # 14 GB of bf16 + 4 GiB of buffers fit a 24 GiB card's 21.7 GiB (23.3 GB)
    (10_000_000_000, "8bit"),  # 20 GB + 4.3 GB do not; 10 GB do
    (27_000_000_000, "4bit"),  # 27 GB of 8-bit do not; 15.2 GB of 4-bit do
    (80_000_000_000, "4bit"),  # nothing fits: the smallest, whose plan says so
])
def test_auto_on_a_gpu_holds_bf16_where_it_fits_else_8_else_4_bit(params, expected):
    budget = 24 * GIB - (800 << 20) - (3 << 29)  # a 24 GiB card less the CUDA context and the reserve
    assert choose_gpu_weights(params, budget, working_bytes=4 * GIB, kept_dense=0) == expected


def test_the_working_buffers_decide_too():
    assert choose_gpu_weights(7_000_000_000, 20 * GIB, working_bytes=2 * GIB) == "dense"
    assert choose_gpu_weights(7_000_000_000, 20 * GIB, working_bytes=8 * GIB) == "8bit"


def test_modes_resolve_to_a_library_for_the_device():
    assert resolve("4bit", "cuda:0", check_installed=False).name == "bnb-nf4"
    assert resolve("4bit", "cpu", check_installed=False).name == "bnb-nf4"
    assert resolve("8bit", "cpu", check_installed=False).name == "bnb-int8"
    with pytest.raises(InputError, match="runs on cuda, not cpu"):
        resolve("torchao-int4", "cpu", check_installed=False)
    with pytest.raises(InputError, match="not a quantized weights mode"):
        resolve("3bit", "cpu")


def test_a_missing_library_is_refused_naming_the_pip_command(monkeypatch):
    monkeypatch.setattr(quantized, "installed", lambda library: library != "bitsandbytes")
    assert resolve("8bit", "cuda").name == "torchao-int8"  # the next library in PREFERENCE
    assert resolve("4bit", "cuda", dtype="bfloat16").name == "torchao-int4"
    with pytest.raises(InputError, match=r"4bit needs a quantization library: pip install bitsandbytes"):
        resolve("4bit", "cuda", dtype="float16")  # tinygemm computes in bf16 only: nf4 was the one left
    with pytest.raises(InputError, match=r"pip install bitsandbytes==0\.50\.2"):
        resolve("bnb-nf4", "cpu")
    monkeypatch.setattr(quantized, "installed", lambda library: False)
    with pytest.raises(InputError, match=r"pip install bitsandbytes==0\.50\.2 or pip install torchao==0\.18\.0"):
        resolve("8bit", "cuda")


def test_labels_say_lossy_for_our_quantization_and_publisher_for_a_checkpoint():
    assert "lossy copy of the bf16 weights" in label("bnb-nf4") and label("bnb-nf4").startswith("4-bit")
    assert "published" in label("prequantized:awq") and "lossy" not in label("prequantized:awq")


def test_launch_offers_every_weights_mode_the_loader_takes():
    from app import cli
    from engine.cpu.int8 import WEIGHT_MODES

    [action] = [a for a in cli.build_parser()._actions if "--weights" in a.option_strings]
    assert set(action.choices) == {"auto", *WEIGHT_MODES, *quantized.QUANTIZED_MODES}


def _qwen3(hidden: int, intermediate: int, layers: int, heads: int) -> Qwen3Config:
    return Qwen3Config(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=8, head_dim=128, vocab_size=151936)


@pytest.mark.parametrize(("config", "expected"), [
    (_qwen3(4096, 12288, 36, 32), "dense"),  # Qwen3-8B's shape: 16.4 GB of bf16 fit beside the buffers
    (_qwen3(5120, 17408, 40, 40), "8bit"),  # Qwen3-14B's: 29.5 GB of bf16 do not, 8-bit does
    (_qwen3(5120, 25600, 64, 64), "4bit"),  # Qwen3-32B's: 8-bit does not either
], ids=["8b", "14b", "32b"])
def test_auto_on_a_24_gib_card_from_the_config_and_the_planners_buffers(monkeypatch, config, expected):
    import torch

    # The card's reading (no GPU here): 24 GiB free before the model loads.
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (24 * GIB, 24 * GIB))
    monkeypatch.setattr(quantized, "installed", lambda library: True)
    names = {"dense": "dense", "8bit": "bnb-int8", "4bit": "bnb-nf4"}
    assert quantized.load_mode("auto", config, "cuda", torch.bfloat16) == names[expected]
    assert quantized.load_mode("dense", config, "cuda", torch.bfloat16) == "dense"  # asked for: as asked


def test_load_mode_on_the_cpu_and_for_a_published_checkpoint():
    import torch

    plain = _qwen3(1024, 3072, 4, 16)
    assert quantized.load_mode("auto", plain, "cpu", torch.float32) == "auto"  # the CPU's own rules decide
    assert quantized.load_mode("4bit", plain, "cpu", torch.float32) == "bnb-nf4"
    published = _qwen3(1024, 3072, 4, 16)
    published.quantization_config = {"quant_method": "awq", "bits": 4}
    assert quantized.load_mode("auto", published, "cuda", torch.bfloat16) == "prequantized:awq"
    with pytest.raises(InputError, match="published quantized"):
        quantized.load_mode("8bit", published, "cuda", torch.bfloat16)
    with pytest.raises(InputError, match="not published quantized"):
        quantized.load_mode("prequantized:awq", plain, "cuda", torch.bfloat16)
