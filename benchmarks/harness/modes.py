"""The inference modes compared side by side, and the one loop each uses to prefill and decode.

- ``standard``: stock SDPA, the whole prompt in one forward, a ``DynamicCache`` on the device
- ``chunked``: stock SDPA and ``DynamicCache``, prompt fed ``chunk_size`` tokens at a time
- ``layerwise``: chunked, with transformers' ``DynamicCache(offloading=True)`` (whole layers to host and back)
- ``headinfer-gN``: the head-wise engine, groups of N KV heads, everything offloaded (the paper's HeadInfer)
- ``headinfer-adaptive``: group size and resident slots chosen by the planner for the budget
- ``...-int8``: host KV stored as 8-bit codes (lossy: half the host RAM and link bytes of bf16); ``...-disk``:
  with a disk tier (``HEADINFER_BENCH_DISK_DIR``, else the temp folder) for the KV beyond the host budget
- CPU smoke: ``stock`` (= chunked), ``headinfer`` (every home resident: zero-copy views),
  ``headinfer-pingpong`` (``resident_slots=0``: every group goes through the ping-pong buffers)
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

import engine
from engine.planning.budgets import held_bytes, num_weights
from engine.planning.machine import measure_activation_peak
from engine.planning.planner import make_plan, paper_memory_table
from engine.planning.plan import Plan
from engine.planning.shape import ModelShape
from engine.planning.policy import OffloadPolicy
from engine.planning.machine_rates import MachineRates, plan_rates

from .models import set_attention


@dataclass(frozen=True)
class Mode:
    name: str
    kind: str  # "standard" | "chunked" | "layerwise" | "headinfer"
    head_group_size: int | None = None
    resident_slots: int | None = None
    host_attention: str = "off"  # the paper's HeadInfer streams every offloaded group; see the -split/-host modes
    kv_dtype: str | None = None  # "int8": 8-bit host KV (a 126 GiB machine holds 1M tokens of Llama-3-8B only so)
    has_disk_tier: bool = False

    @property
    def attention(self) -> str:
        return "headinfer" if self.kind == "headinfer" else "sdpa"

    @property
    def is_chunked(self) -> bool:
        return self.kind != "standard"

    @property
    def is_headinfer(self) -> bool:
        return self.kind == "headinfer"


GPU_MODES = {m.name: m for m in (
    Mode("standard", "standard"),
    Mode("chunked", "chunked"),
    Mode("layerwise", "layerwise"),
    Mode("headinfer-g8", "headinfer", head_group_size=8, resident_slots=0),
    Mode("headinfer-g4", "headinfer", head_group_size=4, resident_slots=0),
    Mode("headinfer-g2", "headinfer", head_group_size=2, resident_slots=0),
    Mode("headinfer-g1", "headinfer", head_group_size=1, resident_slots=0),
    Mode("headinfer-adaptive", "headinfer"),
    # Issue 12: decode attends some (the planner's split) or all offloaded groups on the host.
    Mode("headinfer-g1-split", "headinfer", head_group_size=1, resident_slots=0, host_attention="auto"),
    Mode("headinfer-g1-host", "headinfer", head_group_size=1, resident_slots=0, host_attention="all"),
    # Issue 30: past the RAM limit of bf16 KV: 8-bit host KV, and a disk tier beyond the host budget.
    Mode("headinfer-g1-int8", "headinfer", head_group_size=1, resident_slots=0, kv_dtype="int8"),
    Mode("headinfer-adaptive-int8", "headinfer", kv_dtype="int8"),
    Mode("headinfer-g1-int8-disk", "headinfer", head_group_size=1, resident_slots=0, kv_dtype="int8",
         has_disk_tier=True),
)}

SMOKE_MODES = {m.name: m for m in (
    Mode("stock", "chunked"),
    Mode("headinfer", "headinfer"),
    Mode("headinfer-pingpong", "headinfer", resident_slots=0),
)}

#: the paper's memory-table row that predicts each baseline
_PAPER_ROW = {"standard": "standard", "chunked": "chunked_prefill", "layerwise": "layerwise_offload"}


@dataclass
class Runner:
    """A model on a device plus the budgets every cache is planned with."""

    model: torch.nn.Module
    device: torch.device
    chunk_size: int = 4096
    gpu_budget: int | None = None  # bytes the planner may use on the device (None: unlimited / CPU)
    host_budget: int | None = None  # bytes of host memory the KV store may use
    cuda_context_bytes: int | None = None  # measured before the model was built (CUDA): NVML counts it, plans don't
    _activations: dict[int, int] = field(default_factory=dict, repr=False)  # chunk -> the dry run's peak

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def shape(self) -> ModelShape:
        config = self.model.config.get_text_config()
        # Weights as loaded, as the app's session counts them: an nf4 parameter packs two weights a byte.
        return dataclasses.replace(
            ModelShape.from_config(config, dtype_bytes=torch.tensor([], dtype=self.dtype).element_size(),
                                   num_params=num_weights(self.model)),
            weight_bytes=held_bytes(self.model))

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def describe(self, name: str) -> dict:
        """The model block of a run stamp: what the report needs to recompute FLOPs and floors."""
        shape = dataclasses.asdict(self.shape)
        tied = bool(getattr(self.model.config.get_text_config(), "tie_word_embeddings", False))
        return {"name": name, "tied": tied, "dtype": str(self.dtype).removeprefix("torch."), **shape}

    def use(self, mode: Mode) -> None:
        set_attention(self.model, mode.attention)

    def policy(self, mode: Mode, capacity: int) -> OffloadPolicy:
        return OffloadPolicy(chunk_size=self.chunk_size, head_group_size=mode.head_group_size,
                             resident_slots=mode.resident_slots, max_context=capacity, host_attention=mode.host_attention,
                             gpu_memory=self.gpu_budget if self.is_cuda else None, host_memory=self.host_budget,
                             kv_dtype=mode.kv_dtype, disk_dir=disk_dir() if mode.has_disk_tier else None)

    def plan(self, mode: Mode, context: int) -> Plan | None:
        """The planner's prediction for a head-wise mode (None for the baselines)."""
        if not mode.is_headinfer:
            return None
        return make_plan(self.shape, dataclasses.replace(self.policy(mode, context), max_context=None), context,
                         device_is_cuda=self.is_cuda, gpu_budget=self.gpu_budget, host_budget=self.host_budget,
                         rates=self.rates(mode), activation_bytes=self.activation_bytes())

    def activation_bytes(self) -> int | None:
        """One chunk's activation peak from a dry-run forward on CUDA, as the app's ``MachineBudget`` measures it
        (cached per model and chunk); None elsewhere (the plan keeps its estimate). Without it the harness's plans
        used the estimate, which the H200 runs of 2026-11-27 exceeded by up to 0.25 GiB: the peak step then
        measured a plan the app never makes."""
        if not self.is_cuda:
            return None
        if self.chunk_size not in self._activations:  # plans are made often (searches): measure and switch once
            vocab = self.model.config.get_text_config().vocab_size
            # With head-wise attention, as the app's models run, whichever mode the model was last switched to.
            previous = getattr(self.model.config, "_attn_implementation", None)
            set_attention(self.model, "headinfer")
            try:
                self._activations[self.chunk_size] = measure_activation_peak(self.model, self.chunk_size, vocab)
            finally:
                if previous is not None:
                    set_attention(self.model, previous)
        return self._activations[self.chunk_size]

    def rates(self, mode: Mode) -> MachineRates | None:
        """The machine's measured rates where the mode splits decode by them (``host_attention="auto"`` on CUDA).

        The app's plans get them from its ``MachineBudget``; a cache built without a plan does no probing and so
        streams every offloaded group: the H200 run of 2026-11-27 measured "-split" with a host share of 0."""
        policy = OffloadPolicy(host_attention=mode.host_attention)
        return plan_rates(policy, self.device) if mode.host_attention == "auto" and mode.is_headinfer else None

    def make_cache(self, mode: Mode, capacity: int):
        """An empty cache for ``mode`` able to hold ``capacity`` tokens."""
        config = self.model.config
        if mode.kind == "headinfer":
            policy = self.policy(mode, capacity)
            plan = None  # the cache plans from the config and the policy itself
            rates, activations = self.rates(mode), self.activation_bytes()
            if rates is not None or activations is not None:
                # That plan with what the app's plans carry (DocumentSession's MachineBudget): the split the rates
                # give, and the dry-run chunk's activation peak. The cache itself probes nothing.
                text_config = config.get_text_config(decoder=True)
                dtype_bytes = torch.tensor([], dtype=self.dtype).element_size()
                shape = ModelShape.from_config(text_config, dtype_bytes=dtype_bytes)
                plan = make_plan(shape, policy, capacity, device_is_cuda=self.is_cuda, rates=rates,
                                 activation_bytes=activations)
            return engine.HeadInferCache(config, policy, plan=plan, device=self.device, dtype=self.dtype)
        return DynamicCache(config=config, offloading=mode.kind == "layerwise")

    def forward(self, ids: torch.Tensor, cache) -> torch.Tensor:
        # ids: [1, Q]; only the last position's logits are kept, as generate() does
        return self.model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits

    def prefill(self, mode: Mode, cache, ids: torch.Tensor) -> torch.Tensor:
        """Feeds ``ids`` ([1, S]) into ``cache``: whole for ``standard``, in chunks otherwise."""
        if not mode.is_chunked:
            return self.forward(ids, cache)
        logits = None
        for start in range(0, ids.shape[1], self.chunk_size):
            logits = self.forward(ids[:, start : start + self.chunk_size], cache)
        return logits

    def decode_step(self, cache, token: torch.Tensor) -> torch.Tensor:
        # token: [1, 1]
        return self.forward(token, cache)


def disk_dir() -> str:
    """The disk tier's folder for the ``-disk`` modes (the engine makes a fresh folder in it per cache)."""
    return os.environ.get("HEADINFER_BENCH_DISK_DIR") or tempfile.gettempdir()


def parse_modes(text: str, table: dict[str, Mode]) -> list[Mode]:
    """``"all"`` or a comma list of names (``headinfer`` alone expands to every head-wise mode of the table)."""
    if text == "all":
        return list(table.values())
    modes = []
    for name in filter(None, (n.strip() for n in text.split(","))):
        if name in table:
            modes.append(table[name])
        elif name == "headinfer":
            modes += [m for m in table.values() if m.is_headinfer]
        else:
            raise ValueError(f"unknown mode {name!r}; choose from {', '.join(table)}")
    return modes


def baseline_max_context(shape: ModelShape, mode: Mode, budget: int, chunk_size: int) -> int | None:
    """The paper's formula for the largest context a baseline fits in ``budget`` bytes (None for head-wise)."""
    row = _PAPER_ROW.get(mode.kind)
    if row is None:
        return None
    lo, hi = 0, 1 << 26
    while hi - lo > 256:
        middle = (lo + hi) // 2
        total = paper_memory_table(shape, max(middle, 1), chunk_size)[row]["total"] * 2**30
        lo, hi = (middle, hi) if total <= budget else (lo, middle)
    return lo


def offloaded_heads(mode: Mode, cache, shape: ModelShape) -> int:
    """(layer, KV head) pairs whose K/V cross the link every step."""
    if mode.kind == "layerwise":
        return shape.num_layers * shape.num_kv_heads
    if mode.kind != "headinfer":
        return 0
    return sum(home.group.size for layer in cache.kv_layers if layer.homes is not None  # (a hybrid's state layers:
               for home in layer.homes if home.is_host and cache.device.type != "cpu")  # no K/V)


def headinfer_layout(cache) -> dict:
    """Group size, resident slots and bytes of a head-wise cache, for the record."""
    plan = cache.plan
    return {"head_group_size": plan.head_group_size, "resident_slots": plan.resident_slots,
            "host_attention": plan.host_attention, "host_share": plan.host_share,
            "host_slots": len(cache.schedule.host_slots) if cache.schedule is not None else 0,
            "predicted_decode_s": plan.decode_seconds, "predicted_pcie_floor_s": plan.pcie_floor_seconds,
            "total_slots": plan.total_slots, "kv_device_bytes": cache.kv_bytes()["device"],
            "kv_host_bytes": cache.kv_bytes()["host"],
            # the attention scratch (one buffer at its planned size): a peak past the plan shows whether it grew
            "scratch_planned": plan.allocations.get("scratch", 0), "scratch_allocated": cache.ledger.peak("scratch")}
