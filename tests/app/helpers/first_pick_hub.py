"""The first page's card's test setting, shared by its unit and browser tests: the picker on a stand-in RTX 4090
with a stand-in served model (SmolLM2 by name; a switch is recorded, not loaded), and the tiny model the fake Hub
serves under the pick's name."""

from __future__ import annotations

from types import SimpleNamespace

from app.first_pick import downloadable
from app.owner import OPEN, OwnerGate
from app.picker import ModelPicker
from engine.models import Machine, load_catalogue
from engine.planning.budgets import card_budget
from engine.serving import SwitchOrder

GIB = 2**30
RTX_4090 = Machine("RTX 4090 + 64 GiB", True, card_budget(24 * GIB), int(64 * GIB * 0.85), 500 * GIB, 1e14, 10.0, 900.0)
TINY_CONFIG = ('{"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, '
               '"intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 2048}')
FILES = {"config.json": TINY_CONFIG.encode(), "model.safetensors": b"\0" * 4096}


class SwitchRecorder:
    """The served model, stood in for: its name, and the ``(source, name)`` of each switch asked for."""

    def __init__(self):
        self.model, self.name, self.switched = object(), "HuggingFaceTB/SmolLM2-135M-Instruct", []

    def switch(self, source, name=None, *, weights_bytes=None):
        self.switched.append((source, name))
        self.name = name
        return SimpleNamespace(new=name, old="SmolLM2", load_seconds=3.0, returned_bytes=GIB, closed_documents=1,
                               unloaded_first=False)

    def order_for(self, weights_bytes):
        return SwitchOrder(weights_bytes, 20 * GIB)  # the served 135M model leaves most of the card free


def on_the_4090(gate: OwnerGate = OPEN, uploads=()) -> ModelPicker:
    """The picker on the stand-in machine, kept there across a switch (which makes the picker detect it again);
    ``uploads``: the folders it holds the page's uploads in (never a model source)."""
    picker = ModelPicker(SwitchRecorder(), device="cuda", owner=gate, uploads=list(uploads))
    picker.machine = lambda: RTX_4090
    return picker


def pick_id() -> str:
    """The picker's pick for the stand-in machine: the first row of its table one click can fetch."""
    rows = on_the_4090().refresh()[0]
    entries = {e.id: e for e in load_catalogue()}
    return next(row[0] for row in rows if row[0] in entries and downloadable(entries[row[0]]))
