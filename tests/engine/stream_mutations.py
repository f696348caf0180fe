"""Mutation test of the KV core's synchronisation: remove each wait, one at a time, and see what catches it.

A *site* is one statement of the transfer layer, the disk stream, host attention or the schedule that orders
work across streams or threads: a ``wait_event``, ``synchronize``, event ``record``, a join of a worker's job
(``result``, ``exception``, ``_join``, ``joined``), ``fence``, or a host thread's ``ready()`` / ``wait()`` /
``before_write()``. Each is replaced by ``pass`` (an assignment from it by ``None``) in a copy of its module's
source, whose functions are swapped into the live classes; then the grid's cases run on emulated streams
until one fails: the checker reports a race, an answer differs, or the run raises.

``python tests/engine/stream_mutations.py`` writes the table to docs/streams-mutations.md.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import sys
import types
from dataclasses import dataclass

MODULES = ("engine.kv.transfer", "engine.kv.disk_stream", "engine.kv.host_attention", "engine.kv.schedule")
_METHODS = {"wait_event", "synchronize", "record", "joined", "_join", "fence", "drain", "wait", "exception", "result",
            "_before_write"}
_FUNCTIONS = {"ready", "wait"}
_NOT_SYNC = ("probe",)  # a receiver named so records queries, not events


@dataclass(frozen=True)
class Site:
    module: str
    line: int  # first line of the statement
    end_line: int
    code: str  # the statement as written
    function: str  # the enclosing function

    @property
    def key(self) -> tuple[str, str, str]:
        return self.module.split(".")[-1], self.function, self.code


def _is_sync_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr in _METHODS and not any(n in ast.unparse(func.value) for n in _NOT_SYNC)
    return isinstance(func, ast.Name) and func.id in _FUNCTIONS


def sites() -> list[Site]:
    found = []
    for name in MODULES:
        source = inspect.getsource(importlib.import_module(name))
        tree = ast.parse(source)
        lines = source.splitlines()
        for function in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for node in ast.walk(function):
                is_expr = isinstance(node, ast.Expr) and _is_sync_call(node.value)
                is_assign = isinstance(node, ast.Assign) and _is_sync_call(node.value)
                if (is_expr or is_assign) and _innermost(function, node, tree) is function:
                    code = " ".join(l.strip() for l in lines[node.lineno - 1 : node.end_lineno]).split("  #")[0]
                    found.append(Site(name, node.lineno, node.end_lineno, code, function.name))
    return sorted(set(found), key=lambda s: (s.module, s.line))


def _innermost(function, node, tree):
    """The innermost function that contains ``node`` (a nested ``def wait()`` owns its own statements)."""
    best = function
    for other in ast.walk(tree):
        if isinstance(other, (ast.FunctionDef, ast.AsyncFunctionDef)) and other is not function:
            if (other.lineno >= best.lineno and other.end_lineno <= best.end_lineno
                    and other.lineno <= node.lineno and node.end_lineno <= other.end_lineno):
                best = other
    return best


@contextlib.contextmanager
def mutated(site: Site):
    """The live module's functions and methods replaced by those of a copy with ``site`` removed."""
    module = importlib.import_module(site.module)
    lines = inspect.getsource(module).splitlines()
    first = lines[site.line - 1]
    indent = first[: len(first) - len(first.lstrip())]
    target = first.lstrip().split("=", 1)[0].strip() if "=" in first.split("(", 1)[0] else None
    replacement = f"{indent}{target} = None" if target else f"{indent}pass"
    lines[site.line - 1 : site.end_line] = [replacement] + [""] * (site.end_line - site.line)
    namespace = {"__name__": module.__name__, "__package__": module.__package__, "__file__": module.__file__}
    exec(compile("\n".join(lines) + "\n", module.__file__, "exec"), namespace)
    saved = []
    for key, value in namespace.items():
        live = getattr(module, key, None)
        if (isinstance(value, types.FunctionType) and isinstance(live, types.FunctionType)
                and value.__module__ == module.__name__):  # (not the functions it imports)
            saved.append((module, key, live))
            setattr(module, key, _rebound(value, module))
        elif isinstance(value, type) and isinstance(live, type) and live.__module__ == module.__name__:
            for attr, member in vars(value).items():
                if isinstance(member, types.FunctionType):
                    saved.append((live, attr, vars(live)[attr]))
                    setattr(live, attr, _rebound(member, module))
    try:
        yield
    finally:
        for owner, key, value in reversed(saved):
            setattr(owner, key, value)


def _rebound(function: types.FunctionType, module) -> types.FunctionType:
    """``function`` reading the live module's globals (constants a test patches, the other live functions)."""
    rebound = types.FunctionType(function.__code__, vars(module), function.__name__, function.__defaults__,
                                 function.__closure__)
    rebound.__kwdefaults__ = function.__kwdefaults__
    return rebound


def catches(site: Site, pairs: dict, cases) -> str:
    """What catches ``site``'s removal: '<family>/<case>: race|wrong answer|error ...', or '' if nothing."""
    from streams_grid import max_rel_diff, run

    references = {}
    with mutated(site):
        for family, (stock, headinfer) in pairs.items():
            for case in cases:
                try:
                    outcome = run(stock, headinfer, case)
                except Exception as error:  # noqa: BLE001 - any failure is a catch; the kind is reported
                    kind = "race" if "unordered" in str(error) else f"error ({type(error).__name__})"
                    return f"{family}/{case.name}: {kind}"
                if outcome.races:
                    return f"{family}/{case.name}: race"
                if case.kv_dtype is not None:
                    key = (family, case.name)
                    if key not in references:
                        references[key] = _sync_reference(stock, headinfer, case, site)
                    if max_rel_diff(outcome, references[key]) > 1e-5:
                        return f"{family}/{case.name}: wrong answer"
                elif outcome.max_rel_diff > 1e-5 or not outcome.same_tokens:
                    return f"{family}/{case.name}: wrong answer"
    return ""


def _sync_reference(stock, headinfer, case, site):
    """The synchronous path's answer, without the mutation (a lossy 8-bit run has no stock reference)."""
    from streams_grid import run

    return run(stock, headinfer, case, streams="sync")


def table(pairs: dict, cases) -> list[tuple[Site, str]]:
    return [(site, catches(site, pairs, cases)) for site in sites()]


def main() -> None:
    import datetime
    import platform
    import tempfile
    from pathlib import Path

    from archs import build_pair
    from streams_grid import CASES

    with tempfile.TemporaryDirectory() as folder:
        pairs = {name: build_pair(name, Path(folder) / name) for name in FAMILIES}
        rows = table(pairs, CASES)
    out = ["# Every wait of the KV core, removed one at a time: what catches it",
           "", f"Generated by `python tests/engine/stream_mutations.py` on {datetime.date.today()} "
           f"({platform.machine()}, {platform.processor() or 'CPU'}); emulated streams, seed 0, families "
           f"{', '.join(FAMILIES)}, cases {', '.join(c.name for c in CASES)}.", "",
           "| module | line | function | removed statement | caught by |", "|---|---|---|---|---|"]
    for site, caught in rows:
        reason = UNCAUGHT.get(site.key)
        verdict = caught or (f"not caught: {reason}" if reason else "**nothing**")
        out.append(f"| {site.module.split('.')[-1]} | {site.line} | {site.function} | `{site.code}` | {verdict} |")
    caught = sum(1 for _, c in rows if c)
    out += ["", f"{caught} of {len(rows)} sites caught; the others are listed with the reason nothing in the "
            "grid can catch them (`UNCAUGHT` in `tests/engine/stream_mutations.py`)."]
    Path(__file__).resolve().parents[2].joinpath("docs", "streams-mutations.md").write_text("\n".join(out) + "\n")
    print("\n".join(out))


FAMILIES = ("llama-gqa", "mistral-window")

#: Waits the grid's runs cannot catch, each with the reason; everything else must be caught.
#: (module, function, code)
UNCAUGHT = {
    ("disk_stream", "append", "wait([buffer.job])"):
        "a write buffer is reused two layers later; by then every schedule has joined a later job of the "
        "FIFO disk worker (a fetch at acquire, or host attention's wait for the layer's write): kept as the "
        "buffer's own guard for callers outside the schedule",
    ("disk_stream", "append", "streams.joined(buffer.job)"): "the checker's half of the wait above (same reason)",
    ("disk_stream", "drain", "self.streams.joined(job)"):
        "drain is followed by h2d.synchronize() in fence, and the worker issues its copies on h2d: joining "
        "h2d orders its jobs too; needed on synchronous streams, where the worker copies rows itself",
    ("host_attention", "attend", "job.wait()"):
        "HostAttention.attend is the kernel's stand-alone API (benchmarks, tests), not on the engine's path: "
        "without the wait tests/engine/test_host_attention.py's kernel parity fails",
    ("transfer", "_fetch", "self.synchronize()"):
        "ping-pong buffers grow only when a step acquires past the plan (prefetches never grow them), and every "
        "such step grows the homes first, whose reserve synchronizes: the buffer is idle by then; kept for a "
        "growth the homes do not precede",
    ("transfer", "_fetch", "self._join(buffer)"):
        "no grid schedule drops a disk home's prefetch before it lands; if one did, the checker would see two "
        "threads issuing to h2d without order (it tracks issuers); a hole in the grid's coverage, not in the "
        "checker",
}

if __name__ == "__main__":
    sys.path[:0] = [str(__import__("pathlib").Path(__file__).resolve().parents[2]),
                    str(__import__("pathlib").Path(__file__).resolve().parent)]
    main()
