"""The live memory meters: GPU, process and system RAM, KV cache placement, context use.

Formatting only: the numbers come from ``engine.planning.machine.read_memory`` and
``DocumentSession.memory()``. The GPU row is left out entirely on machines without NVML,
rather than shown as "n/a", because a CPU-only user has nothing to read there.
"""

from __future__ import annotations

from app import escape
from engine import format_bytes
from engine.types import MemorySnapshot


def meters_html(snapshot: MemorySnapshot, kv: dict | None) -> str:
    """Renders the meters; ``kv`` is ``DocumentSession.memory()`` or ``None`` before any document."""
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
    label, value = "KV cache <small>device · host</small>", f"{format_bytes(kv['kv_device'])} · {format_bytes(kv['kv_host'])}"
    if disk:
        label, value = "KV cache <small>device · host · disk</small>", f"{value} · {format_bytes(disk)}"
    rows.append(_row("kv", label, kv["kv_device"], kv_total, value))
    if kv.get("host_attention_ms"):  # decode attends part of the offloaded KV on the CPU
        rows.append(_row("host-attention", "Host attention", 0, 0, f"{kv['host_attention_ms']:.1f} ms/token"))
    context = f"{kv['context_tokens']:,} / {kv['max_context']:,} tokens" if kv["max_context"] else "no document"
    rows.append(_row("context", "Context", kv["context_tokens"], kv["max_context"], context))
    return (
        f'<div class="meters" data-rss="{snapshot.process_rss}" data-kv-device="{kv["kv_device"]}" '
        f'data-kv-host="{kv["kv_host"]}" data-context-tokens="{kv["context_tokens"]}" '
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
