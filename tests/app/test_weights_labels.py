"""What the weights are, said the same way in the header, the plan panel, the picker and the first-pick card: a
lossy copy said to be lossy (GGUF blocks: exact to the file, lossy against the bf16 model; nf4 MoE experts named)."""

from __future__ import annotations

import dataclasses

import pytest
from first_pick_hub import RTX_4090
from transformers import LlamaConfig

from app import escape, picker, render
from app.first_pick import Pick, card_html
from engine.models import load_catalogue, plan_entry
from engine.models import fit_weights_label
from engine.models.quantized import GGUF_LABEL, INT8_LABEL, label
from engine.planning.planner import make_plan
from engine.planning.policy import OffloadPolicy
from engine.planning.shape import ModelShape

GIB = 1 << 30
MOE = "Qwen/Qwen3-30B-A3B-Instruct-2507"  # fused experts
DENSE = "Qwen/Qwen3.6-27B"


def _fit(entry_id: str, mode: str):
    entry = next(e for e in load_catalogue() if e.id == entry_id)
    return dataclasses.replace(plan_entry(entry, RTX_4090), weights_mode=mode)


def _plan():
    shape = ModelShape.from_config(LlamaConfig(num_hidden_layers=4, num_key_value_heads=2, head_dim=64,
                                               num_attention_heads=8, hidden_size=512), dtype_bytes=2)
    return make_plan(shape, OffloadPolicy(), 4096, device_is_cuda=True, gpu_budget=24 * GIB, host_budget=32 * GIB)


def _everywhere(mode: str, words: str, entry_id: str) -> dict[str, str]:
    """The four places' HTML or text for weights held in ``mode`` (``words``: the loaded model's label)."""
    fit = _fit(entry_id, mode)
    return {"header": render.model_header({"name_or_path": "m", "weights": mode, "weights_label": words}),
            "plan panel": render.plan_panel(_plan(), 1000, 1.0, weights=(mode, words)),
            "picker": picker._weights(fit), "first pick": card_html(Pick(fit, "served", 8192))}


def test_gguf_blocks_are_exact_to_the_file_and_a_lossy_copy_of_the_bf16_model_in_all_four_places():
    assert "exact to the GGUF file" in GGUF_LABEL and "lossy copy of the bf16 model" in GGUF_LABEL
    places = _everywhere("gguf", label("gguf"), DENSE)
    assert f'<span class="lossy">{escape.text(GGUF_LABEL)}</span>' in places["header"]
    assert all(escape.text(GGUF_LABEL) in html for html in places.values()), places


def test_nf4_moe_experts_are_named_in_all_four_places():
    loaded = label("bnb-nf4", experts=True)  # what the loader's header says of a MoE loaded in nf4
    planned = label("4bit", experts=True)  # what the picker plans: CUDA's first 4-bit scheme, bnb-nf4
    assert loaded == planned and "the MoE experts in nf4 too; a lossy copy of the bf16 weights" in loaded
    assert fit_weights_label(_fit(MOE, "4bit")) == loaded
    places = _everywhere("bnb-nf4", loaded, MOE)
    places["picker"] = picker._weights(_fit(MOE, "4bit"))
    places["first pick"] = card_html(Pick(_fit(MOE, "4bit"), "served", 8192))
    assert all(escape.text(loaded) in html for html in places.values()), places
    assert '<span class="lossy">' in places["header"]


def test_a_scheme_that_leaves_the_experts_dense_says_so_and_a_dense_model_is_not_told_of_experts():
    assert "the MoE experts left dense" in label("bnb-int8", experts=True)
    assert "experts" not in label("bnb-nf4") and "experts" not in fit_weights_label(_fit(DENSE, "4bit"))


def test_int8_weights_say_lossy_in_the_header_and_the_plan_panel():
    places = _everywhere("int8", label("int8"), DENSE)
    assert f'<span class="lossy">{escape.text(INT8_LABEL)}</span>' in places["header"]
    assert "lossy copy" in INT8_LABEL and escape.text(INT8_LABEL) in places["plan panel"]


@pytest.mark.parametrize("mode", ["torchao-int8", "torchao-int4", "torchao-fp8", "bnb-int8", "bnb-nf4"])
def test_each_library_scheme_reads_the_same_lossy_words_in_the_header_and_the_plan_panel(mode):
    words = label(mode)
    assert words.endswith("a lossy copy of the bf16 weights)")
    header = render.model_header({"name_or_path": "m", "weights": mode, "weights_label": words})
    panel = render.plan_panel(_plan(), 1000, 1.0, weights=(mode, words))
    assert f'<span class="lossy">{escape.text(words)}</span>' in header
    assert f"<span>Weights</span><b>{escape.text(words)}</b>" in panel


def test_dense_weights_add_no_tile_and_a_hostile_published_label_is_escaped():
    assert "Weights" not in render.plan_panel(_plan(), 1000, 1.0, weights=("dense", label("dense")))
    hostile = "awq <img src=x onerror=alert(1)>"
    panel = render.plan_panel(_plan(), 1000, 1.0, weights=("prequantized:awq", hostile))
    assert "<img" not in panel and "&lt;img src=x onerror=alert(1)&gt;" in panel
