"""Which card: a CUDA device with its index for ``torch.cuda`` APIs, and the same card's NVML handle.

Two ways of naming a GPU go wrong on real machines:
- ``torch.device("cuda")`` has no index; torch 2.11's ``set_per_process_memory_fraction`` refuses it
  ("Expected a torch.device with a specified index"), so every API that takes a device gets ``indexed(device)``.
- The CUDA ordinal is not the NVML index: CUDA counts only the cards ``CUDA_VISIBLE_DEVICES`` names, in its
  order (and by default fastest first), NVML counts every card in PCI order. Both agree on the PCI bus id.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


def indexed(device: torch.device | str | int) -> torch.device:
    """``device`` with an index when it is a CUDA device (the current one for a bare ``"cuda"``)."""
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda" or device.index is not None:
        return device
    return torch.device("cuda", torch.cuda.current_device())


def pci_bus_id(device: torch.device | str | int) -> str | None:
    """The card's PCI address as NVML spells it (``"00000000:3b:00.0"``), or None where torch cannot say."""
    properties = torch.cuda.get_device_properties(indexed(device))
    try:
        domain, bus, pci_device = properties.pci_domain_id, properties.pci_bus_id, properties.pci_device_id
    except AttributeError:  # a torch without the PCI fields
        return None
    return f"{domain:08x}:{bus:02x}:{pci_device:02x}.0"


def nvml_handle(nvml, device: torch.device | str | int):
    """The NVML handle of the card torch calls ``device``: matched by PCI bus id, so a reordering
    ``CUDA_VISIBLE_DEVICES`` reads the right card. Without a bus id, the CUDA ordinal (right only unreordered)."""
    bus_id = pci_bus_id(device) if torch.cuda.is_available() else None
    if bus_id is not None:
        try:
            return nvml.nvmlDeviceGetHandleByPciBusId(bus_id)
        except Exception as exc:  # an old binding that wants bytes, a driver that spells the id otherwise
            logger.debug("NVML found no card at %s (%s): NVML index = CUDA ordinal", bus_id, exc)
    index = device if isinstance(device, int) else torch.device(device).index or 0
    return nvml.nvmlDeviceGetHandleByIndex(index)
