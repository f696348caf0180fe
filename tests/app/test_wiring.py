"""Every handler's view has one field per output it is wired to: Gradio drops the extra values of a view longer
than its outputs with only a warning (``continue_reading`` returned a ``ReadView``'s nine values to seven outputs, so
a continued read never cleared the previous document's page chips)."""

from __future__ import annotations

import pytest

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


def test_read_is_held_before_new_files_are_planned():
    """Clicking "Read documents" while a new upload waits in the ingest queue read the previous set: the tab's state
    still held it. The upload's handler now runs after one that disables the button at once, outside that queue;
    the upload's handler enables it again when it knows what to read. (Not the page range's ends: the upload's
    handler sets them too, and a range that needs no change of the button would leave it held.)"""
    from app.ui import hold_read

    demo = build_ui(lambda: None, model_info={"model_name": "a model"}, snapshot_store=None)
    blocks = list(demo.fns.values() if isinstance(demo.fns, dict) else demo.fns)
    by_id = {getattr(block, "id", index): block for index, block in enumerate(blocks)}
    planners = [block for block in blocks if getattr(block.fn, "__name__", None) == "choose_files"]
    assert len(planners) == 1
    for block in planners:
        before = by_id[block.trigger_after]
        assert before.fn is hold_read, getattr(before.fn, "__name__", before.fn)
        read_button = next(o for o in block.outputs if getattr(o, "elem_id", None) == "read")
        assert [o._id for o in before.outputs] == [read_button._id]
        assert before.concurrency_id != "ingest"
    assert hold_read()["interactive"] is False


def test_a_stale_page_chip_is_no_page_not_an_error():
    """CI once saw the browser send ``[]`` for the emptied, hidden chips after a stopped answer; the stock radio
    refused it ("Value: [] is not in the list of choices: []"), a traceback and an error toast. A chip the choices no
    longer hold (from an earlier answer) is the same case. Each is no page; a chip among the choices is that page."""
    import gradio as gr

    from app.chips import PageChips

    demo = build_ui(lambda: None, model_info={"model_name": "a model"}, snapshot_store=None)
    chips = [block for block in demo.blocks.values() if getattr(block, "elem_id", None) == "page-chips"]
    assert len(chips) == 1 and isinstance(chips[0], PageChips)
    assert chips[0].get_block_name() == "radio"  # the browser's stock radio widget

    current = PageChips([("p. 3", "3"), ("p. 12", "12")])
    assert current.preprocess("12") == "12"
    assert current.preprocess(None) is None
    assert current.preprocess([]) is None
    assert current.preprocess("7") is None  # a chip of an earlier answer
    assert PageChips([]).preprocess([]) is None
    with pytest.raises(gr.Error):  # what the stock radio does with the same value
        gr.Radio([]).preprocess([])


def test_read_is_set_by_its_rule_after_each_event_that_changes_what_it_reads():
    """“Read documents” stayed enabled after a clear (its view has no button), on a too-long set with Truncate off
    and after a range that no longer fits (issue 51). Each event that changes what it would read is now followed by
    ``read_offer`` (``app.read_offer``'s rule): the range's ends, Truncate, a read, clear, an open, a reload's
    reopening, an answer (Truncate may be ticked meanwhile); the upload's own handler answers by the rule."""
    demo = build_ui(lambda: None, model_info={"model_name": "a model"}, snapshot_store=None)
    blocks = demo.fns if isinstance(demo.fns, dict) else dict(enumerate(demo.fns))
    following: dict = {}
    for block in blocks.values():
        following.setdefault(block.trigger_after, []).append(block)

    def chain(block) -> list[str]:
        names, todo = [], [block]
        while todo:
            current = todo.pop()
            names.append(getattr(current.fn, "__name__", None))
            todo += following.get(current._id, [])
        return names

    def heads(elem_id: str, event: str) -> list:
        return [block for block in blocks.values() if any(
            name == event and getattr(demo.blocks.get(target), "elem_id", None) == elem_id
            for target, name in block.targets)]

    for elem_id, event in (("range-from", "change"), ("range-to", "change"), ("truncate", "change"),
                           ("read", "click"), ("clear", "click"), ("open-saved", "click"), ("ask", "click"),
                           ("question", "submit")):
        found = heads(elem_id, event)
        assert found and all("read_offer" in chain(block) for block in found), (elem_id, event)
    resume = [block for block in blocks.values() if getattr(block.fn, "__name__", None) == "resume"]
    assert resume and all("read_offer" in chain(block) for block in resume)
