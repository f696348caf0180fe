"""Attention-grounded sources: which pages an answer's tokens attended to, read from the attention itself.

Only an engine that keeps the whole document's exact KV can do this. During an answer a ``QueryProbe`` keeps
the queries of a few retrieval-like heads (``engine.answer.retrieval_heads``); afterwards ``attention_mass`` reads
those heads' keys from the cache once and computes their exact attention weights (softmax over every key a
query saw, tiled over keys with a log-sum-exp pass, so memory stays bounded at a million tokens). The mass on
document positions, bucketed by the pages the caller gave with the document (``DocumentTokens.pages``, never parsed
from its text), gives ``Source(page, share)``, largest share first.
"""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass

import torch

from ..kv.ledger import SOURCES
from ..kv.probe import QueryProbe
from .support import document_share

logger = logging.getLogger(__name__)

_TILE = 16384  # keys per tile: bounds the score block to [heads, answer tokens, tile]


@dataclass(frozen=True)
class Source:
    """A page of the document (``None`` for documents without pages) and its share of the attention."""

    page: str | None  # the page's label as the caller gave it ("37", "xii", "PDF 4"; ``DocumentTokens.pages``)
    share: float

    def label(self) -> str:
        where = f"p. {self.page}" if self.page is not None else "document"
        return f"{where} ({self.share:.0%})"


def page_starts_from_offsets(pages, starts) -> list[tuple[int, str]]:
    """(first token index, page label) of each of ``pages`` (``PageMarker``s, character offsets into the document
    text), from where each token of that text starts in it (``DocumentTokens.starts``): no second tokenization."""
    return [(bisect.bisect_left(starts, page.start), page.label) for page in pages]


@torch.inference_mode()
def attention_mass(cache, probe: QueryProbe, *, per_head: bool = False) -> torch.Tensor:
    """Attention mass per key position, summed over the probe's recorded queries.

    Returns [L] (or [num recorded heads, L] with ``per_head``), float64 on the CPU, L = the cache length.
    """
    # Host homes are complete only once the asynchronous appends (device -> host copies) have landed.
    cache.synchronize()
    length = cache.get_seq_length()
    softcap = getattr(cache.config.get_text_config(decoder=True), "attn_logit_softcapping", None)
    rows = []
    for layer_idx in sorted(probe.heads):  # the probe's layers are KV-layer indices (``cache.kv_layers``)
        recorded = probe.queries(layer_idx)
        layer = cache.kv_layers[layer_idx] if layer_idx < len(cache.kv_layers) else None
        # Skipped: nothing recorded (a KV-sharing consumer's queries are not), or a window ring (it holds only
        # recent tokens; calibration picks full-attention heads anyway). ``per_head`` keeps a zero row per head.
        if recorded is None or layer is None or layer.window is not None:
            if per_head:
                rows.append(torch.zeros(len(probe.heads[layer_idx]), length, dtype=torch.float64))
            continue
        # Per layer: Gemma 4's global layers keep fewer KV heads than its sliding ones.
        n_rep = cache.shape.num_heads // cache.shape.kv_heads[layer.layer_idx]
        queries, positions = recorded  # [H_sel, N, D], N positions
        mass = _recorded(cache, torch.empty(len(probe.heads[layer_idx]), length, dtype=torch.float64))  # [H_sel, L]
        for picked, keys in _keys_by_device(layer, probe.heads[layer_idx], n_rep, length):
            _recorded(cache, keys)
            q = queries[picked].to(keys.device, torch.float32)
            mass[picked] = _mass(q, keys, positions, probe.scaling[layer_idx], None, softcap)
        rows.append(mass)
    if not rows:
        return torch.zeros((0, length) if per_head else (length,), dtype=torch.float64)
    stacked = torch.cat(rows)
    return stacked if per_head else stacked.sum(0)


def _recorded(cache, tensor: torch.Tensor) -> torch.Tensor:
    """Counts a buffer of the sources pass in the cache's allocation ledger (the plan's ``sources``)."""
    ledger = getattr(cache, "ledger", None)
    return tensor if ledger is None else ledger.record(SOURCES, tensor)


def _keys_by_device(layer, heads: list[int], n_rep: int, length: int) -> list[tuple[list[int], torch.Tensor]]:
    """The keys each of ``heads`` (query heads) attends, stacked per device of their homes.

    Returns [(indices into ``heads``, keys [len(indices), L, D])]. A layer can keep some head groups resident on
    the GPU and others in host memory: stacking across them would fail with a device mismatch (after the answer
    has streamed), and moving one side over would copy a million tokens of keys; each device computes its own.
    """
    by_device: dict[torch.device, tuple[list[int], list[torch.Tensor]]] = {}
    for index, head in enumerate(heads):
        home = _home_of(layer, head // n_rep)
        picked, keys = by_device.setdefault(home.device, ([], []))
        picked.append(index)
        keys.append(home.block(0, length)[:, 0, 0, head // n_rep - home.group.start])  # [L, D], batch row 0
    return [(picked, torch.stack(keys)) for picked, keys in by_device.values()]


def _home_of(layer, kv_head: int):
    for home in layer.homes:
        if home.group.start <= kv_head < home.group.stop:
            return home
    raise ValueError(f"KV head {kv_head} is in no home of layer {layer.layer_idx}")


def _mass(q: torch.Tensor, keys: torch.Tensor, positions: list[int], scaling: float, window: int | None,
          softcap: float | None) -> torch.Tensor:
    """Per head, the sum over its queries of softmax(q k^T) over the keys each query saw.

    q: [H, N, D] fp32; keys: [H, L, D]. Returns [H, L] float64 on the CPU. Heads are batched; keys are tiled
    (two passes: log-sum-exp, then weights) so the score block stays [H, N, tile].
    """
    length = keys.shape[1]
    pos = torch.tensor(positions, device=q.device)[:, None]  # [N, 1]

    def scores(start: int, stop: int) -> torch.Tensor:
        s = torch.bmm(q, keys[:, start:stop].to(torch.float32).transpose(1, 2)) * scaling  # [H, N, tile]
        if softcap:
            s = torch.tanh(s / softcap) * softcap
        k_pos = torch.arange(start, stop, device=q.device)[None, :]
        visible = k_pos <= pos
        if window is not None:
            visible &= k_pos > pos - window
        return s.masked_fill(~visible, float("-inf"))

    tile = max(1, _TILE * 8 // max(1, q.shape[0] * q.shape[1] // 64 + 1))  # ~fixed score-block size
    if tile >= length:  # one block: a plain softmax
        return torch.softmax(scores(0, length), dim=-1).sum(1).double().cpu()
    lse = torch.full((*q.shape[:2], 1), float("-inf"), device=q.device)
    for start in range(0, length, tile):
        lse = torch.logaddexp(lse, torch.logsumexp(scores(start, min(start + tile, length)), dim=-1, keepdim=True))
    mass = torch.zeros(q.shape[0], length, dtype=torch.float64)
    for start in range(0, length, tile):
        stop = min(start + tile, length)
        mass[:, start:stop] = torch.exp(scores(start, stop) - lse).sum(1).double().cpu()
    return mass


def rank_sources(mass: torch.Tensor, document_range: tuple[int, int], pages: list[tuple[int, str]],
                 top: int = 5, min_share: float = 0.02) -> list[Source]:
    """Buckets the mass on document positions [start, stop) by page; shares of the document's total mass."""
    start, stop = document_range
    if float(mass[start:stop].sum()) <= 0:
        return []
    if not pages:
        return [Source(None, 1.0)]
    # Shares are of the mass on the pages themselves: the prompt's first tokens (an "attention sink" in most
    # models) and the chat markup would otherwise dilute every share.
    by_page: dict[str, float] = {}
    bounds = [(max(first, start), page) for first, page in pages if first < stop]
    for i, (first, page) in enumerate(bounds):
        last = bounds[i + 1][0] if i + 1 < len(bounds) else stop
        by_page[page] = by_page.get(page, 0.0) + float(mass[first:last].sum())
    total = sum(by_page.values())
    if total <= 0:
        return []
    ranked = sorted(by_page.items(), key=lambda item: -item[1])
    return [Source(page, share / total) for page, share in ranked[:top] if share / total >= min_share]


class AnswerSources:
    """Sources of one answer: ``start`` before its first token is fed back, ``finish`` after the last.

    ``heads``: {layer: [query head, ...]} (``engine.answer.retrieval_heads``); ``document_range``: the document's token
    positions [start, stop); ``pages``: ``page_starts_from_offsets`` of the document's pages.
    """

    def __init__(self, cache, heads: dict[int, list[int]], document_range: tuple[int, int],
                 pages: list[tuple[int, int]]):
        self.cache, self.heads, self.document_range, self.pages = cache, heads, document_range, pages
        self.probe: QueryProbe | None = None
        self.seconds = 0.0  # time spent computing the sources (the extra attention pass)
        self.document_share: float | None = None  # share of the answer's attention on the pages (``support``)

    def start(self, first_position: int) -> None:
        """Records queries from ``first_position`` on (the position the first answer token is fed at)."""
        self.probe = QueryProbe(self.heads, min_position=first_position)
        self.cache.record_queries(self.probe)

    def cancel(self) -> None:
        """Stops recording without computing anything."""
        if self.probe is not None:
            self.cache.record_queries(None)
        self.probe = None

    def finish(self) -> list[Source]:
        if self.probe is None:
            return []
        self.cache.record_queries(None)
        started = time.perf_counter()
        try:
            if self.probe.num_positions == 0:
                return []
            mass = attention_mass(self.cache, self.probe)
            self.document_share = document_share(mass, self.document_range, self.pages)
            return rank_sources(mass, self.document_range, self.pages)
        except torch.OutOfMemoryError as error:
            # The answer has streamed and stays; only its sources are lost (another program took the memory).
            logger.warning("no sources for this answer: out of memory in the sources pass (%s)", error)
            return []
        finally:
            self.seconds = time.perf_counter() - started
            self.probe = None
