"""VRAM that is not there: a device copy far slower than the card's memory names its cause.

Under Windows' display driver NVIDIA's "Sysmem Fallback Policy" lets an allocation the card cannot hold land in
shared system memory instead of failing: the engine's buffers then live across the PCIe link, and every kernel
that reads them runs at the link's speed, in silence (llama.cpp #4498, LM Studio #566, Ollama #7584). A copy from
device memory to device memory tells: on the card it runs at hundreds of GB/s; spilled, it crosses the link twice,
below the link's own rate. So the self-check times one (``measure_device_copy_gbps``) and ``verdict`` compares it
with the link (its generation and width from NVML) and with the measured host-to-device rate.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

SETTING = ("NVIDIA Control Panel > Manage 3D settings > CUDA - Sysmem Fallback Policy > Prefer No Sysmem "
           "Fallback")
#: GB/s one lane moves each way, by PCIe generation (after line encoding).
LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
#: A device copy under this many times the link's rate is not in the card's memory (on the card: 20-100x).
DEVICE_COPY_FLOOR = 2.0
#: A host-to-device copy under this share of the link's rate: the link itself is slow.
LINK_FLOOR = 0.25


def link_gbps(generation: int | None, width: int | None) -> float | None:
    """The PCIe link's rate each way, or None where it could not be read."""
    if not generation or not width or generation not in LANE_GBPS:
        return None
    return LANE_GBPS[generation] * width


def verdict(device_copy_gbps: float | None, h2d_gbps: float | None, link: float | None, *,
            wsl: bool = False) -> str | None:
    """What is wrong with this card's memory, in words, or None when the copies look normal (or could not be
    judged: no link rate)."""
    if link is None:
        return None
    if device_copy_gbps is not None and device_copy_gbps < DEVICE_COPY_FLOOR * link:
        words = (f"the GPU's own memory copies at {device_copy_gbps:.1f} GB/s, no faster than its PCIe link "
                 f"({link:.1f} GB/s): the card is spilling into shared system memory and every read crawls. ")
        if wsl:
            return words + ("WSL2 ignores the Sysmem Fallback setting: free GPU memory (close programs using the "
                            "GPU, lower --gpu-memory or the context)")
        return words + f"Set {SETTING}, or free GPU memory"
    if h2d_gbps is not None and h2d_gbps < LINK_FLOOR * link:
        return (f"host-to-GPU copies run at {h2d_gbps:.1f} GB/s, under a quarter of the PCIe link's {link:.1f} GB/s "
                "(a PCIe socket with fewer lanes, a riser, power saving, or pinned memory charged against the card's): "
                "reads stream KV that much slower")
    return None


def measure_device_copy_gbps(device: torch.device, num_bytes: int = 256 << 20, repeats: int = 3) -> float:
    """Device-to-device copy rate (bytes read, median), timed with CUDA events."""
    from ..planning.machine_rates import measure_copy_gbps

    source = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    return measure_copy_gbps(torch.empty_like(source), source, repeats)


def read_link(gpu_index: int) -> float | None:
    """The card's current PCIe link rate (NVML), or None without NVML."""
    from ..planning.machine import _nvml
    from ..planning.gpu_ids import nvml_handle

    nvml = _nvml()
    if nvml is None:
        return None
    try:
        handle = nvml_handle(nvml, gpu_index)
        # The maximum: an idle card drops its current generation to save power.
        return link_gbps(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle), nvml.nvmlDeviceGetMaxPcieLinkWidth(handle))
    except Exception as error:  # noqa: BLE001 (NVML raises its own error per call; none may break the check)
        logger.debug("PCIe link unreadable: %s", error)
        return None
