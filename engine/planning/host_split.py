"""The decode split: which offloaded head groups stream over the link and which the host attends, and its cost.

A decode step reads every visible KV byte of every offloaded slot once. Streamed bytes cross the link at the
H2D rate; host-attended bytes are read from RAM by the host kernel at its own rate; both halves run at once.
With a share ``s`` of the bytes on the host, a step takes ``max((1 - s) B / h2d, s B / host)``, which is
smallest when both halves finish together: ``s = host / (host + h2d)``. Resident slots cost neither (they
are read from device memory) and are not counted here.
"""

from __future__ import annotations

from dataclasses import dataclass

Slot = tuple[int, int]  # (layer index, head-group index)

# The link speed a plan assumes where none was measured (no CUDA here, or a what-if plan): PCIe 4.0 x16 as
# measured on an RTX 4090 in the HeadInfer paper. The one definition; rates, capacity and the benchmarks use it.
DEFAULT_H2D_GBPS = 25.0


@dataclass(frozen=True)
class DecodeForecast:
    """Predicted KV movement of one decode step (seconds; bytes read from offloaded homes)."""

    host_share: float  # share of the offloaded bytes the host attends
    offloaded_bytes: int
    seconds: float | None  # max(streamed / h2d, host / host rate); None without rates
    pcie_floor_seconds: float | None  # every offloaded byte over the link


def host_share(mode: str, device_is_cuda: bool, host_gbps: float | None, h2d_gbps: float | None, *,
               quantized: bool = False) -> float:
    """Share of the offloaded bytes to attend on the host: 0 (``off``), 1 (``all``), balanced (``auto``).

    ``auto`` balances on CUDA. With CPU compute no byte crosses a link; but 8-bit homes (every home there) would
    be copied and dequantized whole each decode step to be attended, while the host kernel reads their codes in
    place (4-5x faster decode on this project's CPU benchmark): ``auto`` attends them all on the host.
    """
    if mode == "all" or (mode == "auto" and not device_is_cuda and quantized):
        return 1.0
    if mode == "off" or not device_is_cuda or not host_gbps or not h2d_gbps:
        return 0.0
    return host_gbps / (host_gbps + h2d_gbps)


def choose_host_slots(slots: list[Slot], weights: list[int], share: float) -> frozenset[Slot]:
    """The offloaded slots (in forward order, ``weights`` = bytes each reads) the host attends.

    Walking forward, a slot goes to the host when that keeps the host's bytes nearest ``share`` of the bytes so
    far. Host slots are thus spread evenly over the layers, so the link stays busy while the host computes: a
    layer of many groups gets split inside itself, a model of one group per layer alternates layers.
    """
    if share <= 0.0:
        return frozenset()
    if share >= 1.0:
        return frozenset(slots)
    chosen, total, on_host = set(), 0, 0
    for slot, weight in zip(slots, weights, strict=True):
        total += weight
        if abs(on_host + weight - share * total) < abs(on_host - share * total):
            chosen.add(slot)
            on_host += weight
    return frozenset(chosen)


def forecast_decode(offloaded_bytes: int, share: float, host_gbps: float | None,
                    h2d_gbps: float | None) -> DecodeForecast:
    """Seconds per decode step for KV movement alone (a lower bound: weights and compute come on top)."""
    floor = offloaded_bytes / (h2d_gbps * 1e9) if h2d_gbps else None
    host_seconds = share * offloaded_bytes / (host_gbps * 1e9) if host_gbps else None
    streamed_seconds = (1 - share) * offloaded_bytes / (h2d_gbps * 1e9) if h2d_gbps else None
    if share == 0.0:
        seconds = streamed_seconds
    elif share == 1.0:
        seconds = host_seconds
    else:
        seconds = None if host_seconds is None or streamed_seconds is None else max(host_seconds, streamed_seconds)
    return DecodeForecast(share, offloaded_bytes, seconds, floor)
