"""No script from a document or a name (issue 54): every public function of ``app/render.py`` shows hostile names,
page labels and text as text, and ``app/`` escapes HTML only through ``app/escape.py``.

The fuzz test finds the functions with ``inspect``, so a new panel is covered the day it is added (or the test says
which argument it cannot yet make). Each function runs twice, once with a plain word and once with a hostile string
in every value it takes; the two outputs must have the same elements and attributes: anything more came from the
input.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from html.parser import HTMLParser
from pathlib import Path

import pytest
from transformers import LlamaConfig

from app import escape, render
from app.documents import Document
from app.pages import Page
from engine.answer.sources import Source
from engine.answer.support import Support
from engine.planning.capacity import CapacityOption
from engine.planning.planner import make_plan
from engine.planning.policy import OffloadPolicy
from engine.planning.shape import ModelShape
from engine.types import SnapshotInfo

ROOT = Path(__file__).resolve().parents[2]
BENIGN = "benign"
HOSTILE = [
    "<img src=x onerror=alert(document.domain)>",
    '"><script>alert(1)</script>',
    "' onmouseover='alert(1)' x='",
    'javascript:alert(1)" href="javascript:alert(1)',
    "<svg/onload=alert(1)>",
    "</pre></div><iframe srcdoc='<script>alert(1)</script>'>",
    "&lt;img src=x onerror=alert(1)&gt; &#60;script&#62;",  # already escaped: must stay text, not be decoded
    "\u202e<b onclick=alert(1)>\u200b<script\x00>",  # bidi override, zero-width space, NUL
    "＜script＞alert(1)＜/script＞ <!-- <scr<script>ipt>",
]


class _Markup(HTMLParser):
    """The elements and attributes of an HTML fragment, in order."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, tuple[str, ...]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, tuple(name for name, _ in attrs)))

    handle_startendtag = handle_starttag

    def handle_comment(self, data):
        self.tags.append(("<!--", ()))

    def handle_decl(self, decl):
        self.tags.append(("<!", ()))


def markup(fragment: str) -> list[tuple[str, tuple[str, ...]]]:
    parser = _Markup()
    parser.feed(fragment)
    parser.close()
    return parser.tags


def _plan(word: str, *, fits: bool):
    shape = ModelShape.from_config(LlamaConfig(num_hidden_layers=2, num_key_value_heads=2, head_dim=16,
                                               num_attention_heads=4, hidden_size=64,
                                               max_position_embeddings=8192), dtype_bytes=4)
    plan = make_plan(shape, OffloadPolicy(), 4_000, device_is_cuda=True, gpu_budget=1 << 30, host_budget=1 << 33)
    return dataclasses.replace(plan, limited_by=word, reason=word, fits=fits, disk_bytes=1 << 20, disk_slots=2,
                               decode_seconds=0.01, host_share=0.3)


def _snapshot(word: str, partial: bool) -> SnapshotInfo:
    return SnapshotInfo(key=word, label=word, num_tokens=1_000, num_bytes=1 << 20, created=1.7e9, last_used=1.7e9,
                        model=word, dtype=word, path=Path("/tmp") / "x", num_read=400 if partial else None,
                        read_seconds=3.0 if partial else 0.0)


def _model_info(word: str) -> dict:
    info = {key: word for key in ("model_name", "name_or_path", "model_class", "origin", "license", "device", "dtype",
                                  "kv_dtype", "self_check", "weights", "num_layers", "num_kv_heads")}
    return {**info, "params": 1.35e8}


# A hostile (or benign) value per parameter name; a new parameter name fails the test until it is taught here.
MAKERS = {
    "text": lambda w: w, "kind": lambda w: w, "label": lambda w: w, "note": lambda w: w, "limit_note": lambda w: w,
    "name": lambda w: w, "page": lambda w: w, "problem": lambda w: w, "stopped_in": lambda w: w,
    "kv_dtype": lambda w: w, "state": lambda w: w,
    "problems": lambda w: [w, w],
    "documents": lambda w: [Document(w, "pdf", w, 3), Document(w, "txt", w)],
    "token_counts": lambda w: [5, 6],
    "estimate": lambda w: (1.0, 2.0, 3.0),
    "options": lambda w: [CapacityOption(w, 9_000, 1 << 20, 0, None)],
    "infos": lambda w: [_snapshot(w, True), _snapshot(w, False)],
    "sources": lambda w: [Source(w, 0.4), Source(None, 0.1)],
    "pages": lambda w: {w: Page(w, w, 3)},
    "support": lambda w: Support(0.1, -2.0, False, unknown_words=(w, w)),
    "seconds": lambda w: 75.0, "prefill_seconds": lambda w: 12.0, "tokens_per_second": lambda w: 9.5,
    "eta_seconds": lambda w: 30.0, "ttft": lambda w: 0.4, "waited": lambda w: 92.0,
    "position": lambda w: 2, "max_tokens": lambda w: 3_000, "answer_tokens": lambda w: 512, "num_tokens": lambda w: 700,
    "limit": lambda w: 900, "done": lambda w: 10, "total": lambda w: 40, "leftover": lambda w: 1 << 20,
    "sequence": lambda w: 4, "truncated_from": lambda w: 20_000, "conversation_tokens": lambda w: 256,
    "cap": lambda w: 1 << 30, "stopped": lambda w: True, "enabled": lambda w: True,
    "stats": lambda w: w, "range_label": lambda w: w, "read_tokens": lambda w: 712, "read_seconds": lambda w: 61.0,
    "mode": lambda w: w, "weights": lambda w: ("bnb-nf4", w),
}


def _value(function, parameter: inspect.Parameter, word: str):
    if parameter.name == "info":  # the model's description, or a saved snapshot
        return _model_info(word) if "dict" in str(parameter.annotation) else _snapshot(word, True)
    if parameter.name == "plan":
        return _plan(word, fits="nofit" not in function.__name__)
    if parameter.name not in MAKERS:
        raise AssertionError(f"teach this test a hostile {parameter.name!r} for render.{function.__name__}")
    return MAKERS[parameter.name](word)


def _calls(function, word: str):
    """Two calls: every parameter given, and the required ones only (the defaults' branches)."""
    parameters = list(inspect.signature(function).parameters.values())
    every = {p.name: _value(function, p, word) for p in parameters}
    required = {p.name: every[p.name] for p in parameters if p.default is inspect.Parameter.empty}
    return [every, required]


def _public_functions():
    return [(name, function) for name, function in inspect.getmembers(render, inspect.isfunction)
            if not name.startswith("_") and function.__module__ == render.__name__]


HTML_FUNCTIONS = [(name, function) for name, function in _public_functions() if name not in render.PLAIN_TEXT]


def test_the_fuzz_sees_every_panel():
    names = {name for name, _ in _public_functions()}
    assert {"plan_panel", "page_view", "files_table", "saved_panel", "sources_line", "status"} <= {
        name for name, _ in HTML_FUNCTIONS}
    assert render.PLAIN_TEXT <= names  # the plain-text list names only functions that exist


@pytest.mark.parametrize("hostile", HOSTILE)
@pytest.mark.parametrize("name, function", HTML_FUNCTIONS, ids=[name for name, _ in HTML_FUNCTIONS])
def test_no_markup_survives_a_render_function(name, function, hostile):
    for benign_call, hostile_call in zip(_calls(function, BENIGN), _calls(function, hostile), strict=True):
        plain, attacked = function(**benign_call), function(**hostile_call)
        # Same elements, same attributes, in the same order: nothing in the output came from the input.
        assert markup(attacked) == markup(plain), (name, attacked)
        assert "<script" not in attacked.lower() and "<img" not in attacked.lower(), (name, attacked)
        assert all(not attribute.startswith("on") for _, attributes in markup(attacked) for attribute in attributes)


def test_the_truncated_reads_page_and_file_name_are_text_in_the_plan_panel():
    # The reproduction: a read truncated to fit names where it stopped, and that name is a document's.
    hostile = "p. 3 of <img src=x onerror=alert(document.domain)>"
    panel = render.plan_panel(_plan("memory", fits=True), 700, 12.0, truncated_from=20_000, stopped_in=hostile)
    assert [tag for tag, _ in markup(panel) if tag == "img"] == []
    assert escape.text(hostile) in panel


def test_plain_text_functions_return_text_their_callers_escape():
    for name in render.PLAIN_TEXT:
        function = getattr(render, name)
        calls = _calls(function, HOSTILE[0])
        assert all(isinstance(function(**call), str) for call in calls), name
        # Escaped by whoever shows it, the hostile text is text.
        assert all(markup(escape.text(function(**call))) == [] for call in calls), name


# -- one escaping helper -----------------------------------------------------------------------------------------------
def escaping_outside_the_helper(source: str) -> list[str]:
    """What in ``source`` escapes (or could escape) HTML other than through ``app.escape``: the ``html`` module,
    ``markupsafe``, or an ``escape`` imported from either."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] in ("html", "markupsafe")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("html", "markupsafe"):
            found += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Attribute) and node.attr == "escape" and isinstance(node.value, ast.Name) \
                and node.value.id in ("html", "markupsafe", "saxutils"):
            found.append(f"{node.value.id}.escape")
    return found


def test_the_escaping_rule_can_fail():
    assert escaping_outside_the_helper("import html\nx = html.escape(name)\n") == ["html", "html.escape"]
    assert escaping_outside_the_helper("from markupsafe import escape\n") == ["markupsafe.escape"]
    assert escaping_outside_the_helper("from app import escape\nx = escape.text(name)\n") == []


def test_app_escapes_html_only_through_the_helper():
    helper = ROOT / "app" / "escape.py"
    offenders = {str(path.relative_to(ROOT)): found for path in sorted((ROOT / "app").rglob("*.py"))
                 if path != helper and (found := escaping_outside_the_helper(path.read_text(encoding="utf-8")))}
    assert offenders == {}, "escape HTML through app/escape.py (escape.text / escape.attr)"
