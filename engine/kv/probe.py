"""Queries of a few chosen heads, recorded as the schedule attends, to read sources from the attention later.

The schedule hands every layer's post-RoPE queries to an active probe; the probe keeps the rows of its chosen
query heads for positions at or after ``min_position`` (e.g. the answer's tokens). Nothing leaves the compute
device here: the tensors are gathered once, after the answer (no synchronisation per token).
"""

from __future__ import annotations

import torch


class QueryProbe:
    """Records queries of ``heads`` ({layer index: [query head, ...]}) from position ``min_position`` on."""

    def __init__(self, heads: dict[int, list[int]], min_position: int = 0):
        self.heads = {layer: sorted(set(h)) for layer, h in heads.items() if h}
        self.min_position = min_position
        self._index: dict[int, torch.Tensor] = {}
        self._queries: dict[int, list[torch.Tensor]] = {layer: [] for layer in self.heads}
        self._positions: dict[int, list[int]] = {layer: [] for layer in self.heads}
        self.scaling: dict[int, float] = {}

    def record(self, layer_idx: int, past: int, query: torch.Tensor, scaling: float) -> None:
        """query: [B, H, Q, D] of the tokens at positions [past, past + Q); batch row 0 is kept."""
        heads = self.heads.get(layer_idx)
        if heads is None:
            return
        q_len = query.shape[2]
        skip = max(0, self.min_position - past)
        if skip >= q_len:
            return
        index = self._index.get(layer_idx)
        if index is None or index.device != query.device:
            index = self._index[layer_idx] = torch.tensor(heads, device=query.device)
        self._queries[layer_idx].append(query[0, :, skip:].index_select(0, index))  # [H_sel, Q', D]
        self._positions[layer_idx].extend(range(past + skip, past + q_len))
        self.scaling[layer_idx] = scaling

    def queries(self, layer_idx: int) -> tuple[torch.Tensor, list[int]] | None:
        """([H_sel, N, D] queries, their N positions) of one layer, or None if nothing was recorded."""
        parts = self._queries.get(layer_idx)
        if not parts:
            return None
        return torch.cat(parts, dim=1), self._positions[layer_idx]

    @property
    def num_positions(self) -> int:
        return max((len(p) for p in self._positions.values()), default=0)
