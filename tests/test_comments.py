"""Comments say why in a line or two and name their report; numbers live in the reports (docs/benchmarks/).

A comment run or docstring over three lines that carries a figure with a unit (``tests/helpers/comments.py``) is
flagged, save the ones counted below: figures that are settings, limits or formats rather than measurements. Each
count may only fall; no measurement is left in a long comment (the last ones moved to their reports' "Notes from the
code")."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from comments import long_blocks_with_figures, python_files

ROOT = Path(__file__).resolve().parents[1]

#: Long blocks whose figures are a setting, a limit, a format or a quoted message, not a measurement.
SETTINGS = {
    "app/documents/limits.py": 1,  # an example upload's size (a 1 MB bomb)
    "app/documents/pdf_layout.py": 1,  # the running-line rule's share of pages
    "app/documents/sandbox.py": 1,  # an example upload's size
    "app/guard.py": 1,  # the JSON body cap
    "engine/kv/host_attention.py": 1,  # the C kernel's tile cap
    "engine/kv/pin_budget.py": 1,  # HEADINFER_PIN_LIMIT's format
    "engine/paths_windows.py": 1,  # the Windows pin limit's default
    "engine/planning/budgets.py": 1,  # policy.gpu_reserve's default
    "engine/planning/planner.py": 1,  # the paper's table, which the function reproduces
    "engine/planning/policy.py": 1,  # gpu_reserve's default
    "engine/selfcheck/cases.py": 1,  # the disk stream's buffers and the refusal they caused
    "engine/store/streaming.py": 1,  # the page size
    "launch.py": 1,  # its usage examples' flag values (--gpu-memory 20GiB)
}


def _found(root: Path = ROOT) -> Counter:
    return Counter(str(block.path.relative_to(root)) for path in python_files(root)
                   for block in long_blocks_with_figures(path))


def _beyond_settings(found: Counter) -> int:
    """Flagged blocks that are not counted settings."""
    return sum(max(0, count - SETTINGS.get(path, 0)) for path, count in found.items())


def test_no_long_comment_carries_measurements():
    found = _found()
    if _beyond_settings(found):
        flagged = [str(block) for path in python_files(ROOT) for block in long_blocks_with_figures(path)]
        raise AssertionError("comments over three lines carrying figures: say why in a line or two, name the report "
                             f"(docs/benchmarks/...) and move the figures there (or count a setting): {flagged}")


def test_the_counts_fall_with_the_code():
    found = _found()
    stale = {path: (count, found[path]) for path, count in SETTINGS.items() if found[path] < count}
    assert not stale, f"fewer flagged blocks than SETTINGS counts (path: (counted, found)): lower them: {stale}"


def test_the_check_flags_a_long_comment_or_docstring_with_a_figure(tmp_path):
    source = tmp_path / "engine" / "x.py"
    source.parent.mkdir()
    source.write_text('''"""A module.

Its second paragraph says why,
and that it took 98.6 s on one machine.
"""

# Four lines of why
# with no figure in them
# (a 2K-token step, layer 3,
# Linux 5.14+) are fine.

# Three lines with a figure: 1.5x
# faster, 3 ms, fine
# at three lines.

# This block is four lines long
# and carries a measurement:
# 320 MiB on an H200
# that belongs in a report.


def f():
    """One line with 40% in it."""
''')
    blocks = long_blocks_with_figures(source)
    assert [(block.kind, block.first, block.last, block.figures) for block in blocks] == [
        ("docstring", 1, 5, 1), ("comment", 16, 19, 1)]
    assert _found(tmp_path) == {"engine/x.py": 2}
