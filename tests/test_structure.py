"""The house rules of the code, read from its imports (an AST walk, nothing is imported): no import loops in the
engine or the benchmarks, the KV core imports nothing above it, the app never imports torch, and the app and
``launch.py`` use only the engine's public names."""

from __future__ import annotations

from pathlib import Path

import pytest

import structure  # tests/helpers/structure.py: the rules, read from imports
from structure import loops

ROOT = Path(__file__).resolve().parents[1]
# Public modules and the names they offer: the top API, the data it exchanges, the models wing (the picker), the
# self-check, and the error classes.
PUBLIC = ("engine", "engine.types", "engine.models", "engine.selfcheck", "engine.errors")


def imports(path: Path) -> list[tuple[str, list[str], bool]]:
    return structure.imports(ROOT, path)


def graph(folder: str) -> dict[str, set[str]]:
    return structure.graph(ROOT, folder)


@pytest.mark.parametrize("folder", ["engine", "benchmarks"])
def test_no_import_loops(folder):
    # Package __init__ files import their own submodules by design; a loop through one is still a loop.
    assert loops(graph(folder)) == []


def test_the_loop_finder_finds_a_loop():
    assert loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


GROUND = ("engine.errors", "engine.paths", "engine.paths_windows")  # modules that import nothing of the engine


def test_the_kv_core_imports_nothing_above_it():
    for path in (ROOT / "engine" / "kv").rglob("*.py"):
        for module, _, _ in imports(path):
            if module.startswith("engine.") and not module.startswith(("engine.kv", "engine.native")):
                assert module in GROUND, f"{path.name} imports {module}"


def test_native_code_is_the_ground_floor():
    # Building C, the worker pool and the crash probe serve both the KV (host attention) and the weights (int8 and
    # GGUF kernels): they stand below both and import only the errors and the cache folder (issue 33).
    for path in (ROOT / "engine" / "native").rglob("*.py"):
        for module, _, _ in imports(path):
            if module.startswith("engine.") and not module.startswith("engine.native"):
                assert module in GROUND, f"{path.name} imports {module}"


def test_the_models_wing_stands_below_the_session():
    # Loading weights needs no session, snapshot or answer: switching the served model (which opens sessions) is
    # ``engine/serving.py``, above them, and ``weights_mode`` lives in ``models/weights_mode.py``, which the snapshot
    # fingerprints import (issue 33). The floors say it in numbers: models/ below session.py.
    above = ("engine.session", "engine.serving", "engine.store", "engine.answer", "engine.selfcheck", "engine.types")
    for path in (ROOT / "engine" / "models").rglob("*.py"):
        for module, _, _ in imports(path):
            assert not (module == "engine" or module.startswith(above)), f"{path.name} imports {module}"
    edges = graph("engine")
    assert structure.depth(edges, "engine.models") < structure.depth(edges, "engine.session")


# The CPU weights runtime (int8, GGUF blocks, oneDNN, the fused decode layer) stands below the models wing, which
# loads and matches weights and installs its layers; it knows nothing of loading, the picker or the session.
CPU_ABOVE = ("engine.models", "engine.session", "engine.serving", "engine.store", "engine.answer", "engine.selfcheck",
             "engine.types", "engine.read_time")


def imports_above(root: Path, folder: str, above: tuple[str, ...]) -> list[str]:
    """``file: module`` for each import under ``folder`` of the engine's root or of a module under ``above``."""
    return [f"{path.name}: {module}" for path in sorted((root / folder).rglob("*.py"))
            for module, _, _ in structure.imports(root, path)
            if module == "engine" or module.startswith(tuple(f"{a}." for a in above) + above)]


def test_the_cpu_runtime_stands_below_the_models_wing():
    assert imports_above(ROOT, "engine/cpu", CPU_ABOVE) == []
    edges = graph("engine")
    assert structure.depth(edges, "engine.cpu") < structure.depth(edges, "engine.models")


def test_the_cpu_rule_sees_an_import_up(tmp_path):
    (tmp_path / "engine" / "cpu").mkdir(parents=True)
    (tmp_path / "engine" / "cpu" / "up.py").write_text(
        "from ..models.gguf_header import read_header\nfrom ..errors import InputError\nfrom . import int8\n"
        "def f():\n    from .. import load_model\n    import engine.session\n")
    assert imports_above(tmp_path, "engine/cpu", CPU_ABOVE) == [
        "up.py: engine.models.gguf_header", "up.py: engine", "up.py: engine.session"]


def test_reading_time_has_one_wing_below_the_models_and_the_session_holds_it():
    # Pacing, learned chunk costs, the measured first-read rate and the FLOP model live in ``engine/read_time/``
    # (issue 33); the session holds one ``ReadEstimator`` (``session.read_time``) instead of eight estimate methods.
    # The wing stands below the models wing (the picker's estimates use its FLOP model), so it is told the weights
    # mode rather than asking ``models/`` for it.
    import ast

    above = ("engine.session", "engine.serving", "engine.models", "engine.store", "engine.answer",
             "engine.selfcheck", "engine.types")
    for path in (ROOT / "engine" / "read_time").rglob("*.py"):
        for module, _, _ in imports(path):
            assert not (module == "engine" or module.startswith(above)), f"{path.name} imports {module}"
    assert not [p.name for p in (ROOT / "engine").glob("*.py") if p.stem in ("read_rate", "read_cost", "prefill")]
    tree = ast.parse((ROOT / "engine" / "session.py").read_text())
    [session] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "DocumentSession"]
    methods = [node.name for node in session.body if isinstance(node, ast.FunctionDef)]
    assert not [name for name in methods if "estimate" in name or "read_rate" in name or name in (
        "making_a_plan", "_rate_key", "_num_forwards", "_work_shape", "_read_forward")], methods


def test_the_app_never_imports_torch_and_uses_only_public_engine_names():
    import importlib

    offered = {name: set(getattr(module, "__all__", None) or [n for n in vars(module) if n[0].isupper()])
               for name, module in ((name, importlib.import_module(name)) for name in PUBLIC)}
    files = list((ROOT / "app").rglob("*.py")) + [ROOT / "launch.py"]
    for path in files:
        for module, names, _ in imports(path):
            assert module.split(".")[0] not in ("torch", "transformers"), f"{path.name} imports {module}"
            if module == "engine" or module.startswith("engine."):
                assert module in offered, f"{path.relative_to(ROOT)} imports the internal module {module}"
                unknown = [n for n in names if n not in offered[module] and module != "engine" or
                           (module == "engine" and n not in offered[module] and n != "selfcheck")]
                assert not unknown, f"{path.relative_to(ROOT)} imports {unknown} from {module}, not public there"


def test_the_top_api_is_about_a_dozen_names():
    import engine

    # 15: the served model (ModelHolder) and the kernel built before ready (build_host_kernel) joined in issue 33/31.
    assert len(engine.__all__) <= 15


# The benchmarks by subject (issues 33, 52): the most modules each folder holds besides its __init__ ("" is the top,
# which keeps the two modules every study uses, records and corpus).
BENCHMARK_FOLDERS = {"": 2, "harness": 16, "cpu": 16, "gpu": 10, "weights": 10, "quality": 10, "app": 10, "disk": 6,
                     "serving": 4, "tables": 4}
STUDY_FOLDERS = tuple(f"benchmarks.{name}" for name in BENCHMARK_FOLDERS if name not in ("", "harness"))


def test_benchmarks_are_grouped_by_subject_each_folder_capped():
    bench = ROOT / "benchmarks"
    folders = {path.name for path in bench.iterdir() if (path / "__init__.py").exists()}
    assert folders == set(BENCHMARK_FOLDERS) - {""}, "a new folder states its cap in BENCHMARK_FOLDERS"
    for name, cap in BENCHMARK_FOLDERS.items():
        modules = sorted(path.name for path in (bench / name).glob("*.py") if path.name != "__init__.py")
        assert len(modules) <= cap, (name or "top", modules)
    assert {"records.py", "corpus.py"} <= {path.name for path in bench.glob("*.py")}


def test_the_harness_imports_no_study_folder():
    # The harness holds the shared tools (issue 52): the studies use its pieces (models, fill, timing, layout); it
    # never reaches back into them, nor into a study at the top.
    top_studies = tuple(f"benchmarks.{path.stem}" for path in (ROOT / "benchmarks").glob("*.py")
                        if path.stem not in ("__init__", "records", "corpus"))
    for path in (ROOT / "benchmarks" / "harness").glob("*.py"):
        for module, _, _ in imports(path):
            assert not module.startswith(STUDY_FOLDERS + top_studies), f"{path.name} imports {module}"


def test_every_engine_exception_lives_in_errors_under_the_root():
    # One home per error class (issue 33): a caller catching ``HeadInferError`` sees every refusal. The ledger's
    # ``AllocationRefused`` is the exception: it stands in for torch's own OOM, which callers already catch.
    found = structure.exceptions(ROOT, "engine")
    outside = [name for name in found if not name.startswith("engine.errors.") and
               name != "engine.kv.ledger.AllocationRefused"]
    assert outside == []

    def rooted(name: str) -> bool:
        bases = found.get(f"engine.errors.{name}", [])
        return name == "HeadInferError" or any(rooted(base) for base in bases if f"engine.errors.{base}" in found)
    assert [name for name in found if name.startswith("engine.errors.") and not rooted(name.rsplit(".")[-1])] == []


def test_each_public_name_is_imported_from_one_home():
    # Issue 33: a name imported from several modules sends a reader to several rooms. A public name may be imported
    # from the module that defines it and from the public facade that offers it (``engine``, ``engine.types``,
    # ``engine.models``); an error class only from ``engine.errors`` (or those facades): no module re-exports one.
    facades = {"engine", "engine.types", "engine.models"}
    found = structure.homes(ROOT)
    several = {name: sorted(modules) for name, modules in found.items() if len(modules - facades) > 1}
    assert several == {}
    errors = structure.exceptions(ROOT, "engine")
    classes = {name.rpartition(".")[2] for name in errors if name.startswith("engine.errors.")}
    elsewhere = {name: sorted(modules - facades - {"engine.errors"}) for name, modules in found.items()
                 if name in classes and modules - facades - {"engine.errors"}}
    assert elsewhere == {}


def test_few_bare_value_errors_and_no_absolute_imports_inside_the_engine():
    # User-facing refusals raise ``InputError`` (still a ``ValueError``); a bare one marks a programming error.
    import ast

    bare, absolute = [], []
    for path in (ROOT / "engine").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and \
                    getattr(node.exc.func, "id", None) == "ValueError":
                bare.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "engine":
                absolute.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert len(bare) <= 10, bare
    assert absolute == []


def test_at_most_two_functions_over_eighty_lines():
    # Issue 33: a function a reader cannot hold on one screen is split where it has parts of its own (the page's
    # layout and its wiring, a read's take / reopen / prefill / finish). Two long ones remain, each one list: the
    # support study's report and the launcher's argument parser (app/cli.py; launch.py's main went thin in issue 52).
    long = structure.long_functions(ROOT)
    assert len(long) <= 2, long


def test_the_long_function_count_sees_methods_and_nested_functions(tmp_path):
    def body(indent: str, lines: int) -> str:  # a function of ``lines`` lines, its ``def`` included
        return "".join(f"{indent}x{i} = {i}\n" for i in range(lines - 1))

    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "m.py").write_text(
        "class A:\n    def long(self):\n" + body(" " * 8, 81)
        + "def outer():\n    def inner():\n" + body(" " * 8, 81) + body(" " * 4, 2)
        + "def short():\n" + body(" " * 4, 80))
    found = structure.long_functions(tmp_path, places=("app",))
    assert found == [("app/m.py:outer", 83), ("app/m.py:A.long", 81), ("app/m.py:outer.inner", 81)], found


# Modules that are mostly one class whose file keeps another name, each for a reason (issue 52: one word per thing).
NAMED_APART = {
    "app/backend_session.py": "backend_* are the --backend wing's files; RemoteSession is the engine session's double",
    "engine/kv/pinned.py": "pinned host memory: HostMemory allocates it, 'pinned' is the plan's and pin budget's word",
    "engine/reports.py": "the reports the engine streams: PrefillProgress and AnswerChunk, neither the file's one class",
    "engine/serving.py": "serving (switching the served model) is the layer the wing rules name; ModelHolder is public",
}


def test_file_names_match_their_classes():
    # A reader looking for ``Questions`` opens questions.py (was asking.py; 12 modules named apart before, 5 after).
    found = structure.misnamed(ROOT)
    assert sorted(found) == sorted(NAMED_APART), found


def test_the_name_check_finds_a_file_named_apart(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "asking.py").write_text("class Questions:\n    def ask(self):\n        return 1\n")
    (tmp_path / "app" / "page_ranges.py").write_text("class PageRanges:\n    pass\n")
    (tmp_path / "app" / "csp.py").write_text("class ContentSecurityPolicy:\n    pass\n")
    (tmp_path / "app" / "helpers.py").write_text("class Small:\n    pass\n" + "def f():\n    return 1\n" * 3)
    assert structure.misnamed(tmp_path, places=("app",)) == {"app/asking.py": "Questions"}
