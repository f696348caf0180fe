"""Every handler's view has one field per output it is wired to: Gradio drops the extra values of a view longer
than its outputs with only a warning (``continue_reading`` returned a ``ReadView``'s nine values to seven outputs, so
a continued read never cleared the previous document's page chips)."""

from __future__ import annotations

from app import views
from app.ui import build_ui

# Handler name -> the view it returns (or yields).
VIEWS = {
    "choose_files": views.FilesView, "range_offer": views.RangeOffer, "choose_range": views.RangeView,
    "first_part": views.FirstPartView, "read": views.ReadView, "continue_reading": views.ReadView,
    "ask": views.AskView, "saved": views.SavedView, "delete_saved": views.DeleteView, "clear": views.ClearView,
    "open_saved": views.OpenView, "resume": views.OpenView,
}


def test_each_handlers_view_has_one_field_per_output():
    demo = build_ui(lambda: None, model_info={"model_name": "a model"}, snapshot_store=None)
    seen = {}
    for block in (demo.fns.values() if isinstance(demo.fns, dict) else demo.fns):
        name = getattr(block.fn, "__name__", None)
        if name in VIEWS:
            seen.setdefault(name, set()).add(len(block.outputs))
    assert set(seen) == set(VIEWS), set(VIEWS) - set(seen)  # every listed handler is wired
    wrong = {name: (counts, len(VIEWS[name]._fields)) for name, counts in seen.items()
             if counts != {len(VIEWS[name]._fields)}}
    assert not wrong, wrong
