"""The decode split: which offloaded head groups stream over the link and which the host attends, and its cost.

A decode step reads every visible KV byte of every offloaded slot once. Streamed bytes cross the link at the
H2D rate; host-attended bytes are read from RAM by the host kernel at its own rate; both halves run at once.
With a share ``s`` of the bytes on the host, a step takes ``max((1 - s) B / h2d, s B / host)``, which is
smallest when both halves finish together: ``s = host / (host + h2d)``. Resident slots cost neither (they
are read from device memory) and are not counted here.

A split also costs time that streaming does not: each layer with host groups waits for its query to reach the
host and its output to come back, so the CPU cannot run ahead queuing the model's kernels while the link works
(``HOST_LAYER_SECONDS`` a layer). Streaming hides that work under the copies. At short contexts the bytes are too
few to pay for it, and ``auto`` streams everything: a split is chosen only where its forecast is at least
``MIN_GAIN`` faster than streaming.
"""

from __future__ import annotations

from dataclasses import dataclass

Slot = tuple[int, int]  # (layer index, head-group index)

# The link speed a plan assumes where none was measured (no CUDA here, or a what-if plan): PCIe 4.0 x16 as
# measured on an RTX 4090 in the HeadInfer paper. The one definition; rates, capacity and the benchmarks use it.
DEFAULT_H2D_GBPS = 25.0

# Seconds a decode step loses per layer with host-attended groups, beyond the two halves' bytes: fitted on one H200
# run, not measured per machine (docs/benchmarks/gpu-h200.md, Notes from the code).
HOST_LAYER_SECONDS = 3e-3
MIN_GAIN = 0.15  # with the 3 ms, that measurement's split steps were 4% faster to 19% slower than forecast


@dataclass(frozen=True)
class DecodeForecast:
    """Predicted KV movement of one decode step (seconds; bytes read from offloaded homes)."""

    host_share: float  # share of the offloaded bytes the host attends
    offloaded_bytes: int
    seconds: float | None  # max(streamed / h2d, host / host rate) + the host layers' round trips; None without rates
    pcie_floor_seconds: float | None  # every offloaded byte over the link


def host_share(mode: str, device_is_cuda: bool, host_gbps: float | None, h2d_gbps: float | None, *,
               quantized: bool = False, offloaded_bytes: int | None = None, host_layers: int = 0,
               layer_seconds: float | None = None) -> float:
    """Share of the offloaded bytes to attend on the host: 0 (``off``), 1 (``all``), balanced (``auto``).

    ``auto`` balances on CUDA, where it pays: given the step's ``offloaded_bytes`` and the ``host_layers`` that
    would wait for the host, a split whose forecast is not ``MIN_GAIN`` faster than streaming everything gets 0.
    With CPU compute no byte crosses a link; but 8-bit homes (every home there) would be copied and dequantized
    whole each decode step to be attended, while the host kernel reads their codes in place (faster:
    docs/benchmarks/host-attention-cpu.md, Notes from the code): ``auto`` attends them all on the host.
    """
    if mode == "all" or (mode == "auto" and not device_is_cuda and quantized):
        return 1.0
    if mode == "off" or not device_is_cuda or not host_gbps or not h2d_gbps:
        return 0.0
    share = host_gbps / (host_gbps + h2d_gbps)
    if offloaded_bytes is not None:
        split = forecast_decode(offloaded_bytes, share, host_gbps, h2d_gbps, host_layers=host_layers,
                                layer_seconds=layer_seconds)
        if split.seconds >= (1 - MIN_GAIN) * split.pcie_floor_seconds:
            return 0.0
    return share


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


def forecast_decode(offloaded_bytes: int, share: float, host_gbps: float | None, h2d_gbps: float | None, *,
                    host_layers: int = 0, layer_seconds: float | None = None) -> DecodeForecast:
    """Seconds per decode step for KV movement, and the round trips of the ``host_layers`` that wait for the host
    when some of it is attended there (a lower bound: weights and compute come on top)."""
    floor = offloaded_bytes / (h2d_gbps * 1e9) if h2d_gbps else None
    host_seconds = share * offloaded_bytes / (host_gbps * 1e9) if host_gbps else None
    streamed_seconds = (1 - share) * offloaded_bytes / (h2d_gbps * 1e9) if h2d_gbps else None
    if share == 0.0:
        seconds = streamed_seconds
    elif share == 1.0:
        seconds = host_seconds
    else:
        seconds = None if host_seconds is None or streamed_seconds is None else max(host_seconds, streamed_seconds)
    if seconds is not None and share > 0.0:
        seconds += host_layers * (HOST_LAYER_SECONDS if layer_seconds is None else layer_seconds)
    return DecodeForecast(share, offloaded_bytes, seconds, floor)
