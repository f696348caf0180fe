"""What this machine gives a plan, measured once per session: ``MachineBudget`` and ``measure_budget``.

A plan's inputs are the model's shape, the policy and this. Everything the planner needs to know about the
machine is measured here, once, after the model is loaded, so the plan a user is shown is the plan that allocates
(``DocumentSession`` measures, plans and hands the plan to ``HeadInferCache``, whose constructor measures nothing).

GPU: what is free now (``torch.cuda.mem_get_info``: the display, the browser, other programs and the CUDA context
are already taken out) plus what this process's allocator holds (the loaded weights, which the plan counts itself),
less a reserve for what the desktop will still take (``policy.gpu_reserve``, default 1.5 GiB). Host: a share of
the RAM available now, plus what the loaded weights hold (the plan counts them). ``policy.gpu_memory`` /
``policy.host_memory`` replace a reading, here and nowhere else (``make_plan`` applies them only to what-if plans).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import weakref
from dataclasses import dataclass

import psutil
import torch

from ..errors import InputError
from .machine import HOST_BUDGET_FRACTION, measure_activation_peak
from .machine_rates import MachineRates, plan_rates

logger = logging.getLogger(__name__)

# What a CUDA context takes on the card, for what-if plans (a live session reads the card instead): measured
# 784e6 bytes on the first GPU lease (H200, torch 2.11 + CUDA 13.0, 2026-11-26); 450 MiB, the figure assumed for a
# 40-series card before, left a 24 GiB card's plan short by a third of a GiB.
CUDA_CONTEXT_BYTES = 800 << 20


@dataclass(frozen=True)
class MachineBudget:
    """This machine as a plan sees it. Budgets in bytes; ``None`` is unlimited (nothing measured)."""

    device_is_cuda: bool
    gpu_budget: int | None = None  # weights, KV buffers, resident KV and activations together
    host_budget: int | None = None
    rates: MachineRates | None = None  # host attention and H2D rates (CUDA with host attention on)
    activation_bytes: int | None = None  # one chunk's measured activation peak (CUDA), else the planner's estimate


def num_weights(model) -> int:
    """Parameters plus the weights of quantized layers (int8 ``codes``, a GGUF file's ``blocks``: buffers of
    ``in_features x out_features`` weights): the model's weight count whatever its weights mode. A bitsandbytes
    4-bit parameter packs two weights a byte; its ``quant_state`` keeps the weight's shape."""
    quantized = sum(m.in_features * m.out_features for m in model.modules()
                    if "codes" in m._buffers or "blocks" in m._buffers)
    return sum(_weights_in(p) for p in model.parameters()) + quantized


def held_bytes(model) -> int:
    """The bytes a loaded model's tensors take: parameters and buffers (int8 codes and GGUF blocks are buffers;
    a torchao tensor's inner tensors, a bitsandbytes parameter's scales)."""
    return sum(_bytes_of(t) for t in itertools.chain(model.parameters(), model.buffers()))


def _weights_in(tensor) -> int:
    state = getattr(tensor, "quant_state", None)  # bitsandbytes 4-bit: [n * m / 2, 1] packed codes
    return state.shape.numel() if state is not None and getattr(state, "shape", None) is not None else tensor.numel()


def _bytes_of(tensor) -> int:
    # A torchao quantized tensor reports its outer dtype (bf16, fp32): its bytes are its inner tensors'.
    if hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        return sum(_bytes_of(inner) for inner in (getattr(tensor, name) for name in names) if inner is not None)
    extra = [getattr(tensor, "SCB", None)]  # bitsandbytes int8: one fp32 scale a row
    state = getattr(tensor, "quant_state", None)  # bitsandbytes 4-bit: fp32 absmax per block (or nested codes)
    if state is not None:
        extra += [state.absmax, getattr(getattr(state, "state2", None), "absmax", None)]
    return tensor.numel() * tensor.element_size() + sum(e.numel() * e.element_size() for e in extra
                                                        if isinstance(e, torch.Tensor))


def measure_budget(device: torch.device | str, policy, *, model=None, vocab_size: int | None = None,
                   cuda=None) -> MachineBudget:
    """Reads this machine once: free GPU memory (CUDA), available RAM, decode rates, and with ``model`` one dry-run
    chunk's activation peak. ``cuda``: ``torch.cuda`` or a stand-in with its memory calls (tests)."""
    device = torch.device(device)
    if policy.host_memory is not None:  # the one place a budget override applies to a measured machine
        host = policy.host_memory
    else:
        # The plan counts the weights itself: what the loaded model already holds of the RAM is given back.
        held = held_bytes(model) if model is not None else 0
        host = int(psutil.virtual_memory().available * HOST_BUDGET_FRACTION) + held
    if device.type == "cpu":
        return MachineBudget(False, None, host)
    if device.type != "cuda":
        raise InputError(f"unsupported device {str(device)!r}; use 'cpu' or 'cuda[:N]'")
    if cuda is None:
        if not torch.cuda.is_available():
            raise InputError(f"device {str(device)!r} requested but torch sees no CUDA GPU")
        cuda = torch.cuda
    free, _total = cuda.mem_get_info(device)
    held = cuda.memory_reserved(device)  # ours: the weights (counted by the plan) and the allocator's cache
    gpu = gpu_budget(free, held, policy.gpu_reserve, policy.gpu_memory)
    activations = None
    if model is not None:
        activations = measure_activation_peak(model, policy.chunk_size, vocab_size, cuda=cuda)
    budget = MachineBudget(True, gpu, host, plan_rates(policy, device), activations)
    logger.info("GPU budget %.2f GiB (free %.2f + held %.2f - reserve %.2f), host budget %.2f GiB",
                gpu / 2**30, free / 2**30, held / 2**30, policy.gpu_reserve / 2**30, host / 2**30)
    return budget


def gpu_budget(free: int, held: int, reserve: int, override: int | None = None) -> int:
    """The GPU bytes a plan or the weights rule may use: ``free`` now plus ``held`` (ours, given back to the plan),
    less ``reserve``; ``override`` (``policy.gpu_memory``) replaces the reading. The one rule: a read's budget
    (``measure_budget``), the picker's (``catalogue.detect_machine``), the loader's ``weights="auto"``
    (``quantized._auto_on_gpu``) and a stand-in card's (``card_budget``)."""
    return override if override is not None else max(0, free + held - reserve)


def card_budget(total_bytes: int, reserve: int = 3 << 29, context_bytes: int | None = None) -> int:
    """What a card of ``total_bytes`` gives a plan on a quiet desktop, where nothing can be read (a what-if plan,
    a benchmark standing in for a 24 GiB card): ``gpu_budget`` of the total less the CUDA context
    (``context_bytes`` where it was measured, else ``CUDA_CONTEXT_BYTES``)."""
    context = CUDA_CONTEXT_BYTES if context_bytes is None else context_bytes
    return gpu_budget(max(0, total_bytes - context), 0, reserve)


class SharedBudget:
    """One device, many tabs: the sessions serving one loaded model share one reading of the machine, and each
    plans within what the others' documents leave (their KV, buffers and activations; the shared weights are counted
    once, in every plan). So a second visitor's read plans within what is left and never runs the first out of
    memory; where too little is left, its plan says so before anything is allocated.

    ``of(model, policy, measure)`` gives the share of the sessions serving ``model`` under ``policy`` (the app's tabs
    all run one policy), reading the machine (``measure()``) on first use only."""

    _by_model: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    _lock = threading.Lock()

    def __init__(self, machine: MachineBudget):
        self.machine = machine
        self._claims: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # session -> (gpu, host) bytes

    @classmethod
    def of(cls, model, policy, measure) -> SharedBudget:
        with cls._lock:
            shares = cls._by_model.setdefault(model, {})
            if policy not in shares:  # the policy's budgets, reserve and chunk shape the reading
                shares[policy] = cls(measure())
            return shares[policy]

    def held_by_others(self, owner) -> tuple[int, int]:
        """(GPU, host) bytes the other sessions' documents hold."""
        with self._lock:
            others = [claim for session, claim in self._claims.items() if session is not owner]
        return sum(gpu for gpu, _ in others), sum(host for _, host in others)

    def budget_for(self, owner) -> MachineBudget:
        """The machine as ``owner`` may plan on it: the budgets less what the other sessions hold."""
        gpu, host = self.held_by_others(owner)
        if not gpu and not host:
            return self.machine
        less = lambda budget, held: None if budget is None else max(1, budget - held)  # noqa: E731
        return dataclasses.replace(self.machine, gpu_budget=less(self.machine.gpu_budget, gpu),
                                   host_budget=less(self.machine.host_budget, host))

    def claim(self, owner, plan, weight_bytes: int) -> None:
        """``owner``'s document now holds what ``plan`` places, except the weights every session shares."""
        gpu = max(0, plan.gpu_bytes - weight_bytes) if plan.device_is_cuda else 0
        host = plan.host_bytes if plan.device_is_cuda else max(0, plan.host_bytes - weight_bytes)
        with self._lock:
            self._claims[owner] = (gpu, host)

    def release(self, owner) -> None:
        with self._lock:
            self._claims.pop(owner, None)
