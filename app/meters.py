"""The live memory meters: GPU, process and system RAM, KV cache placement, context use.

Formatting only: the numbers come from ``engine.planning.machine.read_memory`` and
``DocumentSession.memory()``. The GPU row is left out entirely on machines without NVML,
rather than shown as "n/a", because a CPU-only user has nothing to read there.

The KV and Context meters show what is filled against what is reserved: the cache's homes are allocated for the whole
context when a read starts, so its held bytes say nothing of the read's progress. During a read (``live_kv``) the
tokens done come from its progress report (the cache counts them only once a layer-major forward ends) and the K/V
written from the plan's bytes per token.
"""

from __future__ import annotations

from app import escape
from engine import format_bytes
from engine.types import MemorySnapshot


def live_kv(session, reading_done: int | None = None) -> dict | None:
    """``session.memory()`` with ``kv_written``, the K/V bytes its context tokens fill (the plan's homes per token,
    never past what is held); ``reading_done``: the tokens a running read has done, which the context then counts."""
    if session is None:
        return None
    kv = dict(session.memory())
    if reading_done is not None:
        kv["context_tokens"] = max(kv["context_tokens"], reading_done)
    held = kv["kv_device"] + kv["kv_host"] + kv.get("kv_disk", 0)
    if held and kv["context_tokens"]:
        kv["kv_written"] = min(kv["context_tokens"] * _bytes_per_token(session), held)
    return kv


def _bytes_per_token(session) -> float:
    """The plan's K/V home bytes per context token (8-bit homes and sliding windows included), once per document."""
    key = (id(session), session.document_tokens, session.max_context)
    cached = _PER_TOKEN.get(key)
    if cached is None:
        plan = session.document_plan()
        homes = plan.allocations.get("homes", 0)
        cached = homes / plan.context_tokens if homes and plan.context_tokens else float(session.shape.kv_bytes_per_token)
        if len(_PER_TOKEN) > 64:  # a tab's entry lives while its document does: a bound, not a cache policy
            _PER_TOKEN.clear()
        _PER_TOKEN[key] = cached
    return cached


_PER_TOKEN: dict[tuple, float] = {}


def meters_html(snapshot: MemorySnapshot, kv: dict | None) -> str:
    """Renders the meters; ``kv`` is ``DocumentSession.memory()`` (or ``live_kv``'s) or ``None`` before any
    document."""
    kv = kv or {"kv_device": 0, "kv_host": 0, "context_tokens": 0, "max_context": 0}
    rows = []
    if snapshot.gpu_total:
        name = escape.text(snapshot.gpu_name or "GPU")
        rows.append(_row("gpu", f"GPU memory <small>{name}</small>", snapshot.gpu_used, snapshot.gpu_total,
                         f"{format_bytes(snapshot.gpu_used)} / {format_bytes(snapshot.gpu_total)}"))
    rows.append(_row("rss", "This app (RSS)", snapshot.process_rss, snapshot.system_total,
                     format_bytes(snapshot.process_rss)))
    rows.append(_row("ram", "System RAM", snapshot.system_used, snapshot.system_total,
                     f"{format_bytes(snapshot.system_used)} / {format_bytes(snapshot.system_total)}"))
    disk = kv.get("kv_disk", 0)
    kv_total = kv["kv_device"] + kv["kv_host"] + disk
    written = int(kv.get("kv_written", 0))
    label = "KV cache <small>written / reserved · device · host</small>"
    value = (f"{format_bytes(written)} / {format_bytes(kv_total)} · {format_bytes(kv['kv_device'])} · "
             f"{format_bytes(kv['kv_host'])}")
    if disk:
        label, value = "KV cache <small>written / reserved · device · host · disk</small>", f"{value} · {format_bytes(disk)}"
    rows.append(_row("kv", label, written, kv_total, value))
    if kv.get("host_attention_ms"):  # decode attends part of the offloaded KV on the CPU
        rows.append(_row("host-attention", "Host attention", 0, 0, f"{kv['host_attention_ms']:.1f} ms/token"))
    context = f"{kv['context_tokens']:,} / {kv['max_context']:,} tokens" if kv["max_context"] else "no document"
    # The plan's counts (with the prompt): filled against the "Context reserved" the plan panel says.
    label = "Context <small>filled / reserved</small>" if kv["max_context"] else "Context"
    rows.append(_row("context", label, kv["context_tokens"], kv["max_context"], context))
    return (
        f'<div class="meters" data-rss="{snapshot.process_rss}" data-kv-device="{kv["kv_device"]}" '
        f'data-kv-host="{kv["kv_host"]}" data-kv-written="{written}" data-context-tokens="{kv["context_tokens"]}" '
        f'data-max-context="{kv["max_context"]}" '
        f'data-has-gpu="{str(bool(snapshot.gpu_total)).lower()}">{"".join(rows)}</div>'
    )


def _row(key: str, label: str, used: int | None, total: int | None, value: str) -> str:
    percent = 100.0 * (used or 0) / total if total else 0.0
    return (
        f'<div class="meter meter-{key}"><div class="meter-head"><span>{label}</span>'
        f'<span class="meter-value">{escape.text(value)}</span></div>'
        f'<div class="meter-track"><div class="meter-fill" style="width:{min(percent, 100.0):.1f}%"></div>'
        f"</div></div>"
    )
