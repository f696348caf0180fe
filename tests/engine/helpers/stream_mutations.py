"""Mutation test of the KV core's synchronisation: remove each wait, one at a time, and see what catches it.

A *site* is one statement of the transfer layer, the disk stream, host attention or the schedule that orders
work across streams or threads: a ``wait_event``, ``synchronize``, event ``record``, a join of a worker's job
(``result``, ``exception``, ``_join``, ``joined``), ``fence``, or a host thread's ``ready()`` / ``wait()`` /
``before_write()``. Each is replaced by ``pass`` (an assignment from it by ``None``) in a copy of its module's
source, whose functions are swapped into the live classes; then the grid's cases run on emulated streams
until one fails: the checker reports a race, an answer differs, or the run raises.

``python tests/engine/helpers/stream_mutations.py`` writes the table to docs/streams-mutations.md.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import sys
import types
from dataclasses import dataclass

MODULES = ("engine.kv.transfer", "engine.kv.disk_stream", "engine.kv.host_attention", "engine.kv.schedule",
           "engine.kv.staging_ring")
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


def host_attention_alone() -> str:
    """``HostAttention.attend``, the kernel's stand-alone call (benchmarks and tests use it), on emulated streams:
    '' when its output equals a float64 reference and no race was seen, else what went wrong."""
    import torch

    from engine.kv import streams as kv_streams
    from engine.kv.host_attention import HostAttention
    from engine.native.workers import TorchWorkers

    backend = kv_streams.make("emulated", torch.device("cpu"), seed=0)
    kernel = HostAttention(TorchWorkers(2), tile_bytes=2048, use_native=False, streams=backend)
    generator = torch.Generator().manual_seed(0)
    kvs = [torch.randn(128, 1, 2, 2, 16, generator=generator) for _ in range(2)]  # [T, B, 2, g, D] per group
    query = torch.randn(1, 8, 1, 16, generator=generator)  # [B, groups * g * n_rep, Q, D]
    try:
        out = kernel.attend(query, kvs, 0, 100, scaling=0.25).clone()
        races = list(backend.checker.races)
    finally:
        backend.close()
    keys = torch.cat([kv[:100, :, 0] for kv in kvs], dim=2).permute(1, 2, 0, 3).double()  # [B, KVH, T, D]
    values = torch.cat([kv[:100, :, 1] for kv in kvs], dim=2).permute(1, 2, 0, 3).double()
    keys, values = keys.repeat_interleave(2, 1), values.repeat_interleave(2, 1)
    expected = torch.softmax(query.double() @ keys.transpose(2, 3) * 0.25, dim=-1) @ values
    if races:
        return "race"
    return "" if float((out.double() - expected).abs().max()) < 1e-5 else "wrong answer"


def host_attention_torch_tile_landing() -> str:
    """The torch tile (the path without a C compiler; the engine's grid runs the C kernel) with its queries landing
    on a copy stream, as on CUDA: '' when its output equals a float64 reference and no race was seen."""
    import torch

    from engine.kv import streams as kv_streams
    from engine.kv.host_attention import HostAttention
    from engine.native.workers import TorchWorkers

    backend = kv_streams.make("emulated", torch.device("cpu"), seed=0)
    kernel = HostAttention(TorchWorkers(2), tile_bytes=2048, use_native=False, streams=backend)
    generator = torch.Generator().manual_seed(1)
    kv = torch.randn(128, 1, 2, 2, 16, generator=generator)  # [T, B, 2, g, D]
    query = torch.randn(1, 4, 1, 16, generator=generator)  # [B, g * n_rep, Q, D]
    landing = torch.full_like(query, float("nan"))
    try:
        stream = backend.new_stream("d2h")
        with backend.use(stream):
            backend.copy(landing, query, "the queries sent to the host")
        landed = backend.event(blocking=True)
        landed.record(stream)
        job = kernel.start(landing, [kv], 0, 100, scaling=0.25, ready=landed.synchronize)
        job.wait()
        out = job.result()
        backend.host_read(out, "the caller reads host attention's output")
        out = out.clone()
        races = list(backend.checker.races)
    finally:
        backend.close()
    keys, values = (kv[:100, :, i].permute(1, 2, 0, 3).double().repeat_interleave(2, 1) for i in (0, 1))
    expected = torch.softmax(query.double() @ keys.transpose(2, 3) * 0.25, dim=-1) @ values
    if races:
        return "race"
    return "" if float((out.double() - expected).abs().max()) < 1e-5 else "wrong answer"


class _Rows:
    """A home's rows, as the disk stream writes them (``GroupHome.write_planes``' contract): one plane here."""

    def __init__(self, rows):
        self.rows = rows

    def write_planes(self, position: int, planes, copy) -> None:
        for plane in planes:
            copy(self.rows[position : position + plane.shape[0]], plane, "a disk home's rows")


def disk_appends_alone() -> str:
    """The disk stream's appends as a caller outside the schedule makes them: more appends in a row than it has
    write buffers (each is reused while the worker may still write the one before), then ``drain`` and a read of
    the rows on this thread. '' when the rows are right and no race was seen."""
    import torch

    from engine.kv import streams as kv_streams
    from engine.kv.disk_stream import WRITES_PER_GROUP, DiskStream

    backend = kv_streams.make("emulated", torch.device("cpu"), seed=0)
    stream, d2h = DiskStream(backend), backend.new_stream("d2h")
    generator = torch.Generator().manual_seed(0)
    chunks = [torch.randn(4, 8, generator=generator) for _ in range(3 * WRITES_PER_GROUP + 1)]  # [tokens, D]
    home = _Rows(torch.zeros(4 * len(chunks), 8))
    try:
        with backend.use(d2h):  # appends run with the d2h stream current (``DiskStream.append``)
            for i, chunk in enumerate(chunks):
                stream.append(home, 4 * i, [chunk])
        stream.drain()
        backend.host_read(home.rows, "the rows, read once the stream is drained")
        right = torch.equal(home.rows, torch.cat(chunks))
        races = list(backend.checker.races)
    finally:
        stream.close()
        backend.close()
    return "race" if races else ("" if right else "wrong answer")


def dropped_disk_prefetch_alone() -> str:
    """``Transfer``'s contract beyond the schedule's order: a caller prefetches a disk home's slot and a RAM home's
    slot (both buffers pending), then acquires a third slot. The buffer holding the disk prefetch is taken over
    while the disk worker may still be issuing its copies; the fetch that replaces it is issued on this thread.

    (The engine's own schedule reaches a dropped disk prefetch too, the grid's ``disk-dropped-prefetch`` case,
    but there the buffer is taken over only after a later job of the same worker was joined, the refetch of the
    dropped slot, which orders it: the join in ``_fetch`` is what makes the contract hold for any caller.)
    '' when the acquired buffer holds the third slot's rows and no race was seen."""
    import tempfile
    from types import SimpleNamespace

    import torch
    from archs import tiny_configs
    from streams_grid import Case, make_cache

    from engine.attention import ATTENTION_NAME
    from engine.kv.buffers import Run

    config = tiny_configs()["llama-gqa"]
    config._attn_implementation = ATTENTION_NAME
    case = Case("dropped-alone", disk=True, disk_share=0.5)
    generator = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        cache = make_cache(SimpleNamespace(config=config), case, disk_dir=folder)
        try:
            head_dim = config.hidden_size // config.num_attention_heads
            for layer in cache.layers:  # 12 tokens in every home: [B, KVH, Q, D]
                layer.update(*(torch.randn(1, config.num_key_value_heads, 12, head_dim, generator=generator)
                               for _ in range(2)))
            transfer = cache.transfer
            slots = [(Run(l, g), layer.homes) for l, layer in enumerate(cache.kv_layers)
                     for g, home in enumerate(layer.homes) if home.is_host]
            on_disk = [s for s in slots if s[1][s[0].first].group.is_on_disk]
            in_ram = [s for s in slots if not s[1][s[0].first].group.is_on_disk]
            assert on_disk and len(in_ram) >= 2, "the check needs a disk home and two RAM homes"
            (run_a, homes_a), (run_b, homes_b), (run_c, homes_c) = on_disk[0], in_ram[0], in_ram[1]
            home_c = homes_c[run_c.first]
            transfer.prefetch(run_a, homes_a, 0, 12, 13)  # on the disk worker, into buffer 0
            transfer.prefetch(run_b, homes_b, 0, 12, 13)  # on this thread, into buffer 1
            index = transfer.acquire(run_c, homes_c, 0, 12, 13)  # neither holds it: buffer 0 is taken over
            fetched = transfer.with_chunk(index, 12, torch.zeros(0, *home_c.kv.shape[1:]))
            right = torch.equal(fetched, home_c.block(0, 12))
            transfer.release(index)
            cache.synchronize()
            races = list(transfer.streams.checker.races)
        finally:
            cache.release()
    return "race" if races else ("" if right else "wrong answer")


def staging_ring_alone() -> str:
    """The staging ring as ``Transfer`` drives it: chunks appended into a pageable home on d2h, then two fetches of
    all its rows through two ring buffers of two rows (each reused many times a fetch, the second fetch's while the
    first's copies may still run): the first joined before the compute stream waits on its ``ready`` and reads it,
    the second read on this thread after a fence (drain, h2d synchronized); then the ring closed (its buffers freed).
    '' when both targets hold the rows and no race was seen."""
    import torch

    from engine.kv.emulated import EmulatedStreams
    from engine.kv.staging_ring import StagingRing

    backend = EmulatedStreams(seed=0, pin_limit=4096)
    h2d, d2h = backend.new_stream("h2d"), backend.new_stream("d2h")
    ring = StagingRing(backend, backend.pin_budget, buffer_bytes=2 * 8 * 4, num_buffers=2)
    generator = torch.Generator().manual_seed(0)
    chunks = [torch.randn(8, 8, generator=generator) for _ in range(3)]  # [tokens, D] on the "device"
    home = torch.zeros(24, 8)  # pageable rows
    landed = backend.event(blocking=True)
    try:
        with backend.use(d2h):
            for i, chunk in enumerate(chunks):
                backend.copy(home[8 * i : 8 * i + 8], chunk, "an append into a pageable home")
            landed.record(d2h)
        target, ready = torch.full((24, 8), float("nan")), backend.event()
        job = ring.fetch([target], [home], h2d, landed, ready)
        job.result()
        backend.joined(job)
        backend.current().wait_event(ready)
        backend.read(target, "the fetched rows attention reads")
        right = torch.equal(target, torch.cat(chunks))
        # The second is not joined: ``Transfer.fence`` (drain, then h2d synchronized) must cover it.
        second = torch.full((24, 8), float("nan"))
        ring.fetch([second], [home], h2d, landed, backend.event())
        ring.drain()
        h2d.synchronize()
        backend.host_read(second, "the rows, read on this thread after the fence")
        right = right and torch.equal(second, torch.cat(chunks))
        ring.close()
        races = list(backend.checker.races)
    finally:
        backend.close()
    return "race" if races else ("" if right else "wrong answer")


#: Checks beyond the grid, for what the engine's own path does not exercise: (name, the module whose waits it
#: exercises, the functions among them or None for all, check returning '' or a kind). Each runs only for those
#: sites (the dropped prefetch's only for ``_fetch``'s, so the table still names a grid case for the others).
EXTRA = (("host-attention-alone", "engine.kv.host_attention", None, host_attention_alone),
         ("host-attention-torch-tile-landing", "engine.kv.host_attention", None, host_attention_torch_tile_landing),
         ("disk-appends-alone", "engine.kv.disk_stream", None, disk_appends_alone),
         ("dropped-disk-prefetch-alone", "engine.kv.transfer", {"_fetch"}, dropped_disk_prefetch_alone),
         ("staging-ring-alone", "engine.kv.staging_ring", None, staging_ring_alone))


def catches(site: Site, pairs: dict, cases) -> str:
    """What catches ``site``'s removal: '<family>/<case>: race|wrong answer|error ...', or '' if nothing."""
    from streams_grid import max_rel_diff, run

    references = {}
    with mutated(site):
        for name, module, functions, check in EXTRA:
            if module != site.module or (functions is not None and site.function not in functions):
                continue
            try:
                kind = check()
            except Exception as error:  # noqa: BLE001 - any failure is a catch
                kind = "race" if "unordered" in str(error) else f"error ({type(error).__name__})"
            if kind:
                return f"{name}: {kind}"
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
           "", f"Generated by `python tests/engine/helpers/stream_mutations.py` on {datetime.date.today()} "
           f"({platform.machine()}, {platform.processor() or 'CPU'}); emulated streams, seed 0, families "
           f"{', '.join(FAMILIES)}, cases {', '.join(c.name for c in CASES)}; then the stand-alone checks "
           f"{', '.join(name for name, *_ in EXTRA)} (the components' contracts beyond the order the engine's own "
           "schedule uses; each runs first for the sites it names).", "",
           "| module | line | function | removed statement | caught by |", "|---|---|---|---|---|"]
    for site, caught in rows:
        reason = UNCAUGHT.get(site.key)
        verdict = caught or (f"not caught: {reason}" if reason else "**nothing**")
        out.append(f"| {site.module.split('.')[-1]} | {site.line} | {site.function} | `{site.code}` | {verdict} |")
    caught = sum(1 for _, c in rows if c)
    out += ["", f"{caught} of {len(rows)} sites caught" + ("." if caught == len(rows) else
            "; the others are listed with the reason nothing in the grid can catch them (`UNCAUGHT` in "
            "`tests/engine/helpers/stream_mutations.py`).")]
    Path(__file__).resolve().parents[3].joinpath("docs", "streams-mutations.md").write_text("\n".join(out) + "\n")
    print("\n".join(out))


FAMILIES = ("llama-gqa", "mistral-window", "gemma3-window")  # gemma3: global layers beside windows

#: Waits nothing catches, each with the reason (module, function, code) -> why; empty: every wait is caught.
UNCAUGHT: dict[tuple[str, str, str], str] = {}

if __name__ == "__main__":
    sys.path[:0] = [str(__import__("pathlib").Path(__file__).resolve().parents[3]),
                    str(__import__("pathlib").Path(__file__).resolve().parent)]
    main()
