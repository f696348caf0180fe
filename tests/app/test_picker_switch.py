"""What the picker says of a switch's order before it starts (beside the served model, or after unloading it), and
after it: the old model loaded back, or none served, with the page still up."""

from __future__ import annotations

import pytest

from app.picker import ModelPicker
from app.render import model_header
from byte_units import format_bytes
from engine.errors import SwitchFailed
from engine.models.catalogue import load_catalogue, plan_entry
from engine.serving import SwitchOrder

from first_pick_hub import GIB, RTX_4090, TINY_CONFIG, SwitchRecorder

QWEN = "Qwen/Qwen3.6-27B"


class Holder(SwitchRecorder):
    """The served model stood in for, with ``free`` bytes beside it and ``failure`` raised by a switch."""

    def __init__(self, name: str, free: int, failure: Exception | None = None):
        super().__init__()
        self.name, self.free, self.failure, self.sizes = name, free, failure, []

    def order_for(self, weights_bytes):
        return SwitchOrder(weights_bytes, self.free)

    def switch(self, source, name=None, *, weights_bytes=None):
        self.sizes.append(weights_bytes)
        if self.failure is not None:
            raise self.failure
        return super().switch(source, name, weights_bytes=weights_bytes)


def _picker(holder, folder=None) -> ModelPicker:
    picker = ModelPicker(holder, device="cuda")
    picker.machine = lambda: RTX_4090
    picker.refresh(str(folder) if folder else None)
    return picker


def _tiny_folder(tmp_path):
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(TINY_CONFIG)
    return folder


def _qwen_bytes() -> int:
    return plan_entry(next(e for e in load_catalogue() if e.id == QWEN), RTX_4090).weights_bytes


def test_the_order_is_said_before_the_switch_starts_unloading_first_where_two_do_not_fit():
    picker = _picker(Holder("Gemma 4", 8 * GIB))
    said = picker.announce(QWEN)
    assert (f"{QWEN} ({format_bytes(_qwen_bytes())}) does not fit beside Gemma 4 in 8.00 GiB free: Gemma 4 is "
            f"unloaded first; if the new one fails to load, Gemma 4 is loaded back.") in said
    assert not picker.holder.switched  # said, not done


def test_a_model_that_fits_beside_is_said_to_load_first():
    said = _picker(Holder("Gemma 4", 40 * GIB)).announce(QWEN)
    assert "fits beside Gemma 4 in 40.00 GiB free: it is loaded first and Gemma 4 serves until it is ready" in said


def test_the_served_models_name_is_escaped_in_the_order_line():
    said = _picker(Holder("<img src=x onerror=alert(1)>", 8 * GIB)).announce(QWEN)
    assert "&lt;img src=x onerror=alert(1)&gt; is unloaded first" in said and "<img" not in said


def test_serve_hands_the_planned_weights_to_the_switch_and_says_the_old_model_is_served_again(tmp_path):
    folder = _tiny_folder(tmp_path)
    failure = SwitchFailed("could not load tiny: out of memory; Gemma 4 is served again")
    holder = Holder("Gemma 4", 8 * GIB, failure)
    picker = _picker(holder, folder)
    message = picker.serve(str(folder))
    assert holder.sizes == [plan_entry(picker._entries[str(folder)], RTX_4090).weights_bytes]
    assert "Could not load tiny: out of memory; Gemma 4 is served again." in message and "Still serving" not in message


@pytest.mark.slow
def test_with_no_model_served_the_header_says_how_to_pick_one_and_a_pick_serves_again(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from engine import OffloadPolicy
    from engine.serving import ModelHolder

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         vocab_size=100, max_position_embeddings=2048)
    torch.manual_seed(0)
    folder = _tiny_folder(tmp_path)
    fails = {str(folder), "old"}  # the picked folder, then the served model's own source

    def load(source):
        if source in fails:
            raise OSError(f"{source} does not load")
        return AutoModelForCausalLM.from_config(config, attn_implementation="headinfer").eval(), None

    holder = ModelHolder(*load("first"), OffloadPolicy(chunk_size=64), "Gemma 4", loader=load, source="old",
                         free_memory=lambda device: 0)
    picker = ModelPicker(holder, device="cpu")
    picker.refresh(str(folder))
    failed = picker.serve(str(folder))
    assert "loading Gemma 4 back failed too: old does not load. No model is served" in failed
    assert "No model is served: open “Models” at the bottom of the page" in model_header(holder.info())
    table, _, _ = picker.refresh()  # the picker still plans and lists
    assert table and picker.announce(str(folder)).count("No model is served: tiny is loaded.") == 1
    fails.clear()
    assert "Now serving tiny" in picker.serve(str(folder)) and holder.model is not None
