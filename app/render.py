"""HTML and Markdown for the panels that show the engine's numbers: model header, memory plan,
prefill progress, per-file table rows, the per-answer stats line and the saved-documents list.

Pure formatting (no engine calls, no Gradio), so handlers stay thin and the wording is tested once. Every value
that goes into the HTML is escaped through ``app.escape`` (a file name, a page label, a model's name, an error).
Every panel carries ``data-*`` attributes with the raw numbers so a browser test can read them
without parsing prose.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from app import escape
from app.documents import Document
from engine import format_bytes
from engine.types import Plan, SnapshotInfo

FILE_TABLE_HEADERS = ["File", "Pages", "Characters", "Tokens"]
# The functions here that return plain text, not HTML (a drop-down label, a number, a line for another panel): whoever
# puts one into a page escapes it. Every other public function returns HTML with each value escaped (``app.escape``).
PLAIN_TEXT = frozenset({"format_seconds", "model_name", "reading_time", "answer_stats", "continue_label",
                        "saved_choice_label", "format_timestamp"})


def format_seconds(seconds: float | None) -> str:
    """``"0.4 s"``, ``"12 s"``, ``"3 min 05 s"``, ``"1 h 02 min"``; ``None`` is ``"–"``."""
    if seconds is None:
        return "–"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def format_short_seconds(seconds: float) -> str:
    """``format_seconds`` to two places under a second: a reopen from disk often takes under 0.1 s."""
    return f"{seconds:.2f} s" if seconds < 1 else format_seconds(seconds)


def status(kind: str, text: str) -> str:
    """Status line HTML; ``kind`` is ``info | ok | warn | error`` (text is escaped)."""
    kind = escape.attr(kind)
    return f'<div class="status status-{kind}" data-kind="{kind}">{escape.text(text)}</div>'


def queue_status(position: int, text: str) -> str:
    """The status line of a visitor waiting for the compute device (``position``: 1 = next)."""
    return (f'<div class="status status-wait" data-kind="wait" data-queue-position="{escape.attr(position)}">'
            f'{escape.text(text)} <span class="leave-hint">Press Cancel or Stop to leave the queue.</span></div>')


def question_bar(max_tokens: int | None, answer_tokens: int, limit_note: str = "") -> str:
    """The longest question this tab may ask now, shown under the question box."""
    if max_tokens is None:
        return '<div class="question-bar" data-max-question="0">Read documents to ask questions about them.</div>'
    note = f" ({limit_note})" if limit_note else ""
    return (f'<div class="question-bar" data-max-question="{max_tokens}">Questions up to {max_tokens:,} tokens '
            f'(about {format_bytes(max_tokens * 4)} of text) beside these documents and a {answer_tokens:,}-token '
            f'answer{escape.text(note)}.</div>')


def model_name(info: dict) -> str:
    """The served model's short name: the last part of its path or Hub id."""
    name = str(info.get("name_or_path") or info.get("model_class") or "model").rstrip("/")
    return name.rsplit("/", 1)[-1]


def weights_span(mode: str, label: str) -> str:
    """The weights' words (``engine.models.quantized.label``: the same in the header, the plan panel, the picker and
    the first-pick card), marked lossy unless the checkpoint was published quantized."""
    kind = "weights" if mode.startswith("prequantized:") else "lossy"
    return f'<span class="{kind}">{escape.text(label)}</span>'


def model_header(info: dict) -> str:
    """One line under the title: which model runs where (and, for a model the studio chose, whose and under which
    license: the publisher's Hub repository, which the PyPI parts mirror)."""
    parts = [f"<strong>{escape.text(str(info.get('model_name') or model_name(info)))}</strong>"]
    if info.get("origin") or info.get("license"):
        origin = " · ".join(escape.text(str(info[key])) for key in ("origin", "license") if info.get(key))
        parts.append(f'<span class="origin">{origin}</span>')
    if info.get("params"):
        parts.append(f"{info['params'] / 1e6:,.0f}M parameters")
    if info.get("num_layers") and info.get("num_kv_heads"):
        parts.append(escape.text(f"{info['num_layers']} layers × {info['num_kv_heads']} KV heads"))
    for key in ("device", "dtype"):
        if info.get(key):
            parts.append(escape.text(str(info[key])))
    if info.get("weights") not in (None, "dense") and info.get("weights_label"):
        parts.append(weights_span(str(info["weights"]), str(info["weights_label"])))
    if info.get("degrades_past"):  # Qwen2.5-1M: its card reads on with Dual Chunk Attention, which is not run here
        parts.append(f'<span class="lossy">answers degrade past {info["degrades_past"]:,} tokens (the model card: '
                     f'no Dual Chunk Attention here)</span>')
    if info.get("kv_dtype"):  # 8-bit host KV: said wherever it is on, as it is lossy
        parts.append(f'<span class="lossy">KV {escape.text(str(info["kv_dtype"]))} (lossy)</span>')
    if info.get("self_check"):  # the engine's self-check on this GPU: "exact on this GPU ✓ <date>" or what failed
        text = str(info["self_check"])
        parts.append(f'<span class="self-check" data-ok="{"✓" in text}">{escape.text(text)}</span>')
    return f'<div class="model-line">{" · ".join(parts)}</div>'


def files_table(documents: Sequence[Document], token_counts: Sequence[int], read_tokens: int | None = None,
                range_label: str | None = None) -> str:
    """The per-file table: name, pages (blank for formats without pages), characters, tokens.

    ``read_tokens``: what the read takes (the files with the prompt around them: the count the plan, the progress
    and the status say), the table's one total, so no second sum of the same documents stands beside it;
    ``range_label``: the page range read ("p. 12 – p. 40 of bash.pdf"), said in that row."""
    if not documents:
        return '<div class="files-empty" data-files="0"></div>'
    head = "".join(f"<th>{name}</th>" for name in FILE_TABLE_HEADERS)
    rows = "".join(
        f'<tr><td class="file-name">{escape.text(doc.name)}</td><td>{"" if doc.pages is None else doc.pages}</td>'
        f"<td>{doc.chars:,}</td><td>{tokens:,}</td></tr>"
        for doc, tokens in zip(documents, token_counts, strict=True)
    )
    total = sum(token_counts) if read_tokens is None else read_tokens
    if read_tokens is not None or len(documents) > 1:
        pages = sum(doc.pages or 0 for doc in documents)
        files = f"{len(documents)} file{'s' if len(documents) != 1 else ''}"
        what = f"{files} · {escape.text(range_label)}" if range_label else files
        what += " · with the prompt" if read_tokens is not None else ""
        rows += (f'<tr class="files-total" data-tokens="{total}"><td>{what}</td><td>{pages or ""}</td>'
                 f"<td>{sum(doc.chars for doc in documents):,}</td><td>{total:,}</td></tr>")
    return (f'<div class="files-scroll" data-files="{len(documents)}" data-read-tokens="{total}"><table class="files">'
            f"<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>")


def replan_notice() -> str:
    """The plan panel once the served model changed under the chosen files: their plan was the old model's."""
    return ('<div class="plan plan-empty" data-fits="">The served model changed: “Read documents” plans and reads '
            "the chosen files again with it.</div>")


def empty_plan() -> str:
    return ('<div class="plan plan-empty" data-fits="">Drop files to see the memory plan: '
            "how much GPU and host memory reading them will take, before anything runs.</div>")


def reading_time(estimate) -> str:
    """``"≈ 1 min 09 s (55 s – 1 min 20 s)"`` from (low, likely, high) seconds; a bare number as ``"≈ 12 s"``; an
    estimate marked ``provisional`` (``engine.read_time.read_rate.ReadEstimate``) starts with "estimating…"."""
    if isinstance(estimate, tuple):
        low, likely, high = estimate
        if getattr(estimate, "provisional", False):  # this machine's reading cost is still being measured
            return (f"estimating… ≈ {format_seconds(likely)} for now ({format_seconds(low)} – {format_seconds(high)}; "
                    "measuring this machine's reading speed)")
        return f"≈ {format_seconds(likely)} ({format_seconds(low)} – {format_seconds(high)})"
    return f"≈ {format_seconds(estimate)}"


def refused_plan(problems: Sequence[str]) -> str:
    """The plan panel of a set none of whose files can be read: what was dropped and why, with the numbers."""
    items = "".join(f"<li>{escape.text(problem)}</li>" for problem in problems)
    return (f'<div class="plan plan-nofit plan-refused" data-fits="false"><div class="plan-verdict">Nothing can be '
            f"read</div><ul>{items}</ul></div>")


def range_info(label: str | None, num_tokens: int | None, limit: int) -> str:
    """The chosen page range's token count and whether it fits."""
    if label is None or num_tokens is None:
        return (f'<div class="range-info" data-fits="">Choose pages from–to (at most {limit:,} tokens fit), or '
                "press “First part that fits”.</div>")
    fits = num_tokens <= limit
    verdict = "fits" if fits else "does not fit"
    return (f'<div class="range-info range-{"fits" if fits else "nofit"}" data-fits="{str(fits).lower()}" '
            f'data-tokens="{num_tokens}">{escape.text(label)}: {num_tokens:,} tokens · {verdict} '
            f"(at most {limit:,})</div>")


def plan_panel(plan: Plan, num_tokens: int, prefill_seconds: float | None, kv_dtype: str | None = None,
               options: Sequence = (), *, truncated_from: int | None = None, stopped_in: str | None = None,
               conversation_tokens: int = 0, read_seconds: float | None = None,
               weights: tuple[str, str] | None = None) -> str:
    """The memory plan of a document set: predicted memory, fit, chunk/head-group sizes, time.

    ``weights``: the served weights' (mode, words) (``DocumentSession.weights``): a tile unless they are as stored.

    ``num_tokens`` counts the documents with the prompt around them, as the read, its progress and the files
    table's total do (one count per thing on the screen); ``plan.context_tokens`` adds the room kept for answers,
    which is what memory is reserved for.

    ``truncated_from``: the set was truncated to fit; ``plan`` is then the plan of what is read, and
    ``num_tokens`` and ``truncated_from`` count the tokens read and the whole set's, both with the prompt
    (as the reading progress does); ``stopped_in``: the page the truncated read ends in ("p. 37 of bash.pdf").
    ``conversation_tokens``: the session's conversation allowance (``answer_budget``), shown beside the documents'
    share of the context limit. ``read_seconds``: the read is over and took this long, which the reading time
    then says instead of the estimate made before it.
    """
    if not plan.fits:
        verdict = ("nofit", "Does not fit in memory")
    elif not plan.is_within_limit:
        verdict = ("nofit", "Too long for this model" if plan.limited_by == "model" else "Over the context limit")
    else:
        verdict = ("fits", "Fits")
    counts = f"{num_tokens:,} tokens with the prompt, {plan.context_tokens:,} with room for answers"
    truncated = ""
    if truncated_from is not None:
        up_to = f", up to {stopped_in}" if stopped_in else ""
        verdict = (verdict[0], f"Read the first {num_tokens:,} tokens of {truncated_from:,}{up_to}")
        counts = f"truncated to fit; documents with the prompt, {plan.context_tokens:,} with room for answers"
        truncated = f' data-truncated-from="{truncated_from}"'
    groups = f"{plan.num_groups} group{'s' if plan.num_groups != 1 else ''}/layer"
    if plan.groups_per_buffer > 1:  # a run of adjacent streamed groups arrives in one copy (GPU decode)
        groups += f" · {plan.groups_per_buffer} fetched per copy"
    tiles = [
        ("GPU memory", _gpu_line(plan)),
        ("Host memory", f"{format_bytes(plan.host_bytes)} of {_budget(plan.host_budget)}"),
        _context_tile(plan),
        ("Chunk size", f"{plan.chunk_size:,} tokens"),
        ("Head group", f"{plan.head_group_size} KV head{'s' if plan.head_group_size != 1 else ''} · {groups}"),
        ("Slots on device", f"{plan.resident_slots}/{plan.total_slots}"),
        ("Reading time", reading_time(prefill_seconds) if read_seconds is None else
         f"read in {format_seconds(read_seconds)}"),
        ("Context limit", f"{plan.context_limit:,} tokens · {_LIMITED_BY.get(plan.limited_by, plan.limited_by)}"),
    ]
    share = max(plan.context_limit - conversation_tokens, 0)
    if conversation_tokens:
        tiles.append(("Documents' share", f"{share:,} tokens · {conversation_tokens:,} kept for the conversation"))
    if weights is not None and weights[0] != "dense":  # the header's words, lossy said so
        tiles.append(("Weights", weights[1]))
    if kv_dtype:
        tiles.append(("KV storage", f"{kv_dtype}, lossy (answers may differ from the model's own)"))
    if plan.disk_bytes:
        tiles.append(("Disk tier", f"{format_bytes(plan.disk_bytes)} · {plan.disk_slots} slots (exact, slower)"))
    if plan.pin_limit is not None or plan.staged_bytes:  # pinned memory as a budget (Windows, WSL2, a pin limit)
        tiles.append(("Pinned memory", plan.pinning_line()))
    if options:  # memory binds: how far 8-bit KV or a disk tier would reach
        tiles.append(("Reaches", " · ".join(f"{o.name} {o.max_context:,}" for o in options)))
    if plan.decode_seconds is not None:
        split = f" · {plan.host_share:.0%} of offloaded KV attended on the CPU" if plan.host_share else ""
        tiles.append(("Decode (predicted)", f"≈ {plan.decode_seconds:.3f} s/token{split}"))
    grid = "".join(f"<div><span>{label}</span><b>{escape.text(value)}</b></div>" for label, value in tiles)
    if plan.is_within_limit:  # what binds, in words that agree with "Fits" (no "longer texts need ...")
        where = _LIMITED_BY.get(plan.limited_by, plan.limited_by)
        line = f"Documents may take up to {share:,} tokens here ({where}: {plan.context_limit:,} tokens" + (
            f", less {conversation_tokens:,} kept for the answer and earlier turns)" if conversation_tokens else ")")
        reason = f'<p class="plan-limit">{escape.text(line)}</p>'
    else:
        reason = f'<p class="plan-reason">{escape.text(plan.limit_reason)}</p>'
    read = f' data-read-seconds="{read_seconds:.2f}"' if read_seconds is not None else ""
    return (
        f'<div class="plan plan-{verdict[0]}" data-fits="{str(plan.is_within_limit).lower()}" '
        f'data-tokens="{num_tokens}" data-context-tokens="{plan.context_tokens}" data-gpu-bytes="{plan.gpu_bytes}" '
        f'data-host-bytes="{plan.host_bytes}" '
        f'data-limit="{plan.context_limit}" data-limited-by="{escape.attr(plan.limited_by)}" '
        f'data-documents-share="{share}"{truncated}{read}>'
        f'<div class="plan-verdict">{escape.text(verdict[1])} <small>· {escape.text(counts)}</small></div>'
        f'{reason}<div class="plan-grid">{grid}</div></div>'
    )


_LIMITED_BY = {"model": "the model's window", "max_context": "--max-context", "memory": "memory"}


def _context_tile(plan: Plan) -> tuple[str, str]:
    """What the context takes: reserved where the plan is read, else needed (nothing is reserved for a set that is
    not read whole: "11,267 tokens reserved" stood beside an 8,192-token window)."""
    if plan.is_within_limit:
        return "Context reserved", f"{plan.context_tokens:,} tokens"
    over = "more than memory holds" if not plan.fits else f"more than the {plan.context_limit:,}-token limit"
    return "Context needed", f"{plan.context_tokens:,} tokens · {over}: none reserved"


def _gpu_line(plan: Plan) -> str:
    if not plan.device_is_cuda:
        return "none (CPU compute)"
    return f"{format_bytes(plan.gpu_bytes)} of {_budget(plan.gpu_budget)}"


def _budget(budget: int | None) -> str:
    return "no limit" if budget is None else format_bytes(budget)


def progress_bar(done: int = 0, total: int = 0, tokens_per_second: float = 0.0,
                 eta_seconds: float | None = None, state: str = "idle", note: str = "") -> str:
    """The prefill progress bar; ``state`` is ``idle | running | reopening | done | cancelled | failed``."""
    percent = 100.0 * done / total if total else (100.0 if state == "done" else 0.0)
    if state == "idle":
        label = note or "Not read yet."
    else:
        label = f"{done:,} / {total:,} tokens"
        if state == "running" and tokens_per_second <= 0:
            label += " · starting…"  # no rate (and so no ETA) before the first chunk ends
        elif state == "running":
            label += f" · {tokens_per_second:,.1f} tok/s · ETA {format_seconds(eta_seconds)}"
        elif tokens_per_second > 0:
            label += f" · {tokens_per_second:,.1f} tok/s"
        if note:
            label += f" · {note}"
    return (
        f'<div class="progress progress-{escape.attr(state)}" data-state="{escape.attr(state)}" data-done="{done}" data-total="{total}">'
        f'<div class="progress-track" role="progressbar" aria-valuemin="0" aria-valuemax="{total}" '
        f'aria-valuenow="{done}"><div class="progress-fill" style="width:{percent:.1f}%"></div></div>'
        f'<div class="progress-label">{escape.text(label)}</div></div>'
    )


_IMAGE = re.compile(r"!(?=\[)")  # ![alt](url) and ![alt][ref]
_TAG = re.compile(r"<(?=[A-Za-z/!?])")  # the start of an HTML tag, comment or processing instruction


def model_markdown(text: str) -> str:
    """Model-written Markdown made inert: images become plain links and HTML tags show as text, so an
    answer never makes the browser fetch a URL (a document can lead the model to write one)."""
    return _TAG.sub("&lt;", _IMAGE.sub("", text))


def answer_stats(ttft: float | None, num_tokens: int, tokens_per_second: float, *, done: bool = True,
                 stopped: bool = False, waited: float | None = None) -> str:
    """``"TTFT 0.42 s · 31 tokens · 13.9 tok/s"``; marks a stopped answer. ``waited``: the seconds it waited in line
    first, said beside its first-token time (``"TTFT 2.45 s after 1 min 32 s in line"``), which counts from the
    front of the line."""
    queued = f" after {format_seconds(waited)} in line" if waited is not None else ""
    text = (f"TTFT {'–' if ttft is None else f'{ttft:.2f} s'}{queued} · {num_tokens} tokens · "
            f"{tokens_per_second:.1f} tok/s")
    if stopped:
        text += " · stopped"
    elif not done:
        text += " · writing…"
    return text


def saved_panel(infos: Sequence[SnapshotInfo], cap: int | None, *, enabled: bool = True,
                problem: str | None = None, leftover: int = 0) -> str:
    """The "Saved documents" list: label, tokens, size and last use per snapshot, then the total and cap."""
    if not enabled:
        return '<div class="saved saved-off" data-count="0">Saving documents to disk is turned off.</div>'
    total = sum(info.num_bytes for info in infos)
    limit = "no size limit" if cap is None else f"limit {format_bytes(cap)}"
    attrs = f'data-count="{len(infos)}" data-total-bytes="{total}" data-cap-bytes="{"" if cap is None else cap}"'
    left = (f' · <span class="saved-leftover" data-bytes="{leftover}">+ {format_bytes(leftover)} of an interrupted '
            "save, removed at the next start</span>") if leftover else ""
    summary = f'<div class="saved-summary">{len(infos)} saved · {format_bytes(total)} on disk · {limit}{left}</div>'
    if problem:
        return f'<div class="saved" {attrs}><p class="saved-problem">{escape.text(problem)}</p>{summary}</div>'
    if not infos:
        return (f'<div class="saved saved-empty" {attrs}>Nothing saved yet: documents you read are saved here '
                f"so that reading them again is instant.{summary}</div>")
    rows = "".join(
        f'<tr data-key="{escape.attr(info.key)}"><td class="file-name">{escape.text(info.label)}{_partial_note(info)}</td>'
        f"<td>{info.num_tokens:,}</td><td>{format_bytes(info.num_bytes)}</td>"
        f"<td>{format_timestamp(info.last_used)}</td></tr>"
        for info in infos
    )
    return (f'<div class="saved" {attrs}><table class="files saved-table"><thead><tr><th>Documents</th>'
            f"<th>Tokens</th><th>Size</th><th>Last used</th></tr></thead><tbody>{rows}</tbody></table>"
            f"{summary}</div>")


def continue_label(info: SnapshotInfo) -> str:
    """``"Continue reading (62%)"``: what the shelf offers for a read cut short by a crash or a restart."""
    return f"Continue reading ({int(100 * info.fraction_read)}%)"


def _partial_note(info: SnapshotInfo) -> str:
    """Under a partial read's name: the offer, what is left to read and its estimate at the read's rate so far."""
    if not info.is_partial:
        return ""
    rest = info.remaining_seconds
    estimate = f" · about {format_seconds(rest)}" if rest is not None else ""
    return (f'<div class="saved-partial" data-num-read="{info.num_read}">{continue_label(info)} · '
            f"{info.num_tokens - info.num_read:,} tokens left{estimate}</div>")


def saved_choice_label(info: SnapshotInfo) -> str:
    """How a snapshot reads in the delete drop-down."""
    partial = f" · {continue_label(info)}" if info.is_partial else ""
    return f"{info.label} · {info.num_tokens:,} tokens · {format_bytes(info.num_bytes)}{partial}"


def format_timestamp(seconds: float) -> str:
    """Local ``"2025-11-22 14:05"``; ``0`` (unknown) is ``"–"``."""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds)) if seconds else "–"


def sources_line(sources, pages: dict | None = None) -> str:
    """``"Sources: p. 13 (41%) · p. 9 (12%)"`` from the engine's attention-grounded sources; with ``pages``
    (``app.pages.split_pages``), each page's PDF sequence is its tooltip."""
    if not sources:
        return ""

    def part(source) -> str:
        page = (pages or {}).get(str(source.page))
        title = f' title="PDF page {page.sequence}"' if page is not None else ""
        return f"<span{title}>{escape.text(source.label())}</span>"

    parts = " · ".join(part(source) for source in sources)
    return f'<span class="answer-sources" title="Pages the answer attended to most, read from the model\'s attention">Sources: {parts}</span>'


MAY_NOT_SAY = "The document may not say this — check the pages it looked at"


def support_note(support) -> str:
    """The plain warning beside an answer the document may not support (``engine.answer.support.Support``);
    empty for a supported answer or one without the signal."""
    if support is None or support.is_supported:
        return ""
    # The question's words the document never uses (when they are why it is flagged): a reason to check at a glance.
    unknown = support.unknown_words
    never = (f' <span class="never-mentioned">(the document never mentions '
             f'{", ".join(f"“{escape.text(word)}”" for word in unknown[:5])})</span>') if unknown else ""
    return (f'<span class="answer-unsupported" title="Little of the answer\'s attention was on the document\'s pages, '
            f'the model wrote it unsure, or the question names what the document never does">'
            f'⚠ {escape.text(MAY_NOT_SAY)}{never}</span>')


def answer_message(text: str, stats: str, sources=(), pages: dict | None = None, support=None) -> str:
    """An answer's chat message: its words (inert Markdown), its stats line, the support warning and its sources."""
    # The warning first, then where the answer looked: the reader checks those pages.
    note = support_note(support)
    line = f'\n\n{note}' if note else ""
    line += f'\n\n{sources_line(sources, pages)}' if sources else ""
    return f'{model_markdown(text) or "…"}\n\n<span class="answer-stats">{escape.text(stats)}</span>{line}'


def page_view(page: str | None, name: str = "", text: str = "", sequence: int | None = None) -> str:
    """The page viewer beside the chat: one page's text, titled with its printed label ("p. 37"), its PDF
    sequence as the tooltip."""
    if page is None:
        return '<div class="page-view empty">Click a page chip under an answer to read that page here.</div>'
    where = f"{escape.text(name)} · " if name else ""
    label = f"PDF page {page[4:]}" if page.startswith("PDF ") else f"p. {page}"
    title = f' title="PDF page {sequence}"' if sequence is not None else ""
    seq = f' data-sequence="{sequence}"' if sequence is not None else ""
    return (f'<div class="page-view" data-page="{escape.attr(page)}"{seq}><div class="page-title"{title}>'
            f'{where}{escape.text(label)}</div><pre>{escape.text(text) or "(no text on this page)"}</pre></div>')
