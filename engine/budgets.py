"""What this machine gives a plan, measured once per session: ``MachineBudget`` and ``measure_budget``.

A plan's inputs are the model's shape, the policy and this. Everything the planner needs to know about the
machine is measured here, once, after the model is loaded, so the plan a user is shown is the plan that allocates
(``DocumentSession`` measures, plans and hands the plan to ``HeadInferCache``, whose constructor measures nothing).

GPU: what is free now (``torch.cuda.mem_get_info``: the display, the browser, other programs and the CUDA context
are already taken out) plus what this process's allocator holds (the loaded weights, which the plan counts itself),
less a reserve for what the desktop will still take (``policy.gpu_reserve``, default 1.5 GiB). Host: a share of
the RAM available now. ``policy.gpu_memory`` / ``policy.host_memory`` replace a reading (``make_plan`` applies them,
in one place).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psutil
import torch

from .rates import MachineRates, plan_rates
from .telemetry import HOST_BUDGET_FRACTION, measure_activation_peak

logger = logging.getLogger(__name__)

CUDA_CONTEXT_BYTES = 450 << 20  # what creating a CUDA context takes on a 40-series card (what-if plans only)


@dataclass(frozen=True)
class MachineBudget:
    """This machine as a plan sees it. Budgets in bytes; ``None`` is unlimited (nothing measured)."""

    device_is_cuda: bool
    gpu_budget: int | None = None  # weights, KV buffers, resident KV and activations together
    host_budget: int | None = None
    rates: MachineRates | None = None  # host attention and H2D rates (CUDA with host attention on)
    activation_bytes: int | None = None  # one chunk's measured activation peak (CUDA), else the planner's estimate

    @classmethod
    def unmeasured(cls, device: torch.device | str) -> MachineBudget:
        """No reading at all: budgets only from the policy (``make_plan`` applies them), nothing probed."""
        return cls(device_is_cuda=torch.device(device).type == "cuda")


def measure_budget(device: torch.device | str, policy, *, model=None, vocab_size: int | None = None,
                   cuda=None) -> MachineBudget:
    """Reads this machine once: free GPU memory (CUDA), available RAM, decode rates, and with ``model`` one dry-run
    chunk's activation peak. ``cuda``: ``torch.cuda`` or a stand-in with its memory calls (tests)."""
    device = torch.device(device)
    host = int(psutil.virtual_memory().available * HOST_BUDGET_FRACTION)
    if device.type == "cpu":
        return MachineBudget(False, None, host)
    if device.type != "cuda":
        raise ValueError(f"unsupported device {str(device)!r}; use 'cpu' or 'cuda[:N]'")
    if cuda is None:
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r} requested but torch sees no CUDA GPU")
        cuda = torch.cuda
    free, _total = cuda.mem_get_info(device)
    held = cuda.memory_reserved(device)  # ours: the weights (counted by the plan) and the allocator's cache
    gpu = max(0, free + held - policy.gpu_reserve)
    activations = None
    if model is not None:
        activations = measure_activation_peak(model, policy.chunk_size, vocab_size, cuda=cuda)
    budget = MachineBudget(True, gpu, host, plan_rates(policy, device), activations)
    logger.info("GPU budget %.2f GiB (free %.2f + held %.2f - reserve %.2f), host budget %.2f GiB",
                gpu / 2**30, free / 2**30, held / 2**30, policy.gpu_reserve / 2**30, host / 2**30)
    return budget


def card_budget(total_bytes: int, reserve: int = 3 << 29) -> int:
    """What a card of ``total_bytes`` gives a plan on a quiet desktop, where nothing can be read (a what-if plan,
    a benchmark standing in for a 24 GiB card): the total less the CUDA context and the reserve."""
    return max(0, total_bytes - CUDA_CONTEXT_BYTES - reserve)
