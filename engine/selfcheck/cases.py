"""The self-check's cases: tiny random models through the real stream path, compared with stock transformers.

A case is one feature (the overlapped transfer schedule, host attention, 8-bit KV, the disk tier) on one tiny
architecture in one dtype: a chunked prefill then greedy decode through a ``HeadInferCache`` whose policy turns
the feature on, against stock transformers with the same weights (8-bit KV, lossy by design, against the same
policy run without overlap on synchronous streams, which must agree). Every home that can be offloaded is: head
groups of one KV head with one resident slot, so a layer mixes a resident home and offloaded ones. A model served
with quantized weights (``engine.models.quantized``) is checked over tiny models quantized the same way, against
stock over the same quantized weights.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache, Gemma3TextConfig, LlamaConfig, Qwen3MoeConfig

from ..cache import HeadInferCache, cache_argument
from ..models.quantized import Quantization, quantization_config
from ..planning.planner import make_plan
from ..planning.shape import ModelShape
from ..planning.policy import OffloadPolicy

logger = logging.getLogger(__name__)

PROMPT_LEN, DECODE_STEPS, CHUNK, CONTEXT = 45, 8, 16, 128  # the prompt spans 3 chunks, longer than the windows
RTOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}  # max |a - b| / max |b| of the logits (as the GPU parity tests)
_COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=97, max_position_embeddings=256)

# What a self-check can test, and turn off where it fails.
FEATURES = ("overlap", "host_attention", "kv8", "disk_tier")
MOE = "qwen3-moe"
# The MoE case checks weights (fused experts, in nf4 where the served weights are), not a KV feature: one case
# through the whole stream path (overlap) does.
ARCH_FEATURES = {MOE: ("overlap",)}


def tiny_configs() -> dict[str, object]:
    """GQA without windows (every home kind), Gemma 3's mix of sliding-window rings and full layers, and a
    Qwen3-MoE (transformers' fused experts: nf4 under ``bnb-nf4``, as the loader quantizes them; experts 64 wide,
    whole nf4 blocks)."""
    return {
        "llama-gqa": LlamaConfig(**_COMMON),
        "gemma3-window": Gemma3TextConfig(**_COMMON, head_dim=16, sliding_window=8,
                                          layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
        MOE: Qwen3MoeConfig(**_COMMON, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64),
    }


@dataclass(frozen=True)
class CaseResult:
    feature: str
    arch: str
    dtype: str
    passed: bool
    max_rel_error: float | None = None  # of the logits, prefill and every decode step
    tokens_equal: bool | None = None  # greedy tokens (up to a near-tie in the reference, which may flip)
    error: str | None = None  # an exception the case raised
    seconds: float = 0.0
    checked: bool = True  # False: the case could not be set up here (a fault of the check, not of the feature)


@dataclass
class TinyPair:
    """Stock transformers and the head-wise model, with identical random weights, on ``device`` in ``dtype``."""

    arch: str
    stock: torch.nn.Module
    headinfer: torch.nn.Module
    dtype: torch.dtype
    device: torch.device
    rtol: float = 0.0  # the logits' tolerance (0: RTOL of the dtype)

    @classmethod
    def build(cls, arch: str, dtype: torch.dtype, device: torch.device,
              scheme: Quantization | None = None) -> "TinyPair":
        config = tiny_configs()[arch]
        torch.manual_seed(1234)
        if scheme is not None:
            return cls._quantized(arch, config, dtype, device, scheme)
        stock = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="sdpa", dtype=dtype)
        headinfer = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="headinfer",
                                                     dtype=dtype)
        headinfer.load_state_dict(stock.state_dict())
        return cls(arch, stock.to(device).eval(), headinfer.to(device).eval(), dtype, device, RTOL[dtype])

    @classmethod
    def _quantized(cls, arch: str, config, dtype: torch.dtype, device: torch.device,
                   scheme: Quantization) -> "TinyPair":
        """Both models loaded from one saved random model by the library's quantizer: the same quantized weights.
        The feed-forward is 128 wide: bitsandbytes' CPU nf4 kernel reads inputs in blocks of 64."""
        config = copy.deepcopy(config)
        config.intermediate_size = 128
        with tempfile.TemporaryDirectory(prefix="headinfer-self-check-") as folder:
            AutoModelForCausalLM.from_config(copy.deepcopy(config), dtype=dtype).save_pretrained(folder)
            with torch.device("meta"):
                skeleton = AutoModelForCausalLM.from_config(copy.deepcopy(config), dtype=dtype)
            models = [AutoModelForCausalLM.from_pretrained(
                folder, dtype=dtype, attn_implementation=attention, device_map={"": str(device)},
                quantization_config=quantization_config(scheme, dtype, str(device), lambda: skeleton)).eval()
                for attention in ("sdpa", "headinfer")]
        return cls(arch, *models, dtype, device, max(RTOL[dtype], scheme.parity_rtol or 0.0))

    def prompt(self) -> torch.Tensor:
        seeded = torch.Generator().manual_seed(7)
        return torch.randint(0, self.stock.config.vocab_size, (1, PROMPT_LEN), generator=seeded).to(self.device)


def case_policy(feature: str, user: OffloadPolicy, streams: str, *, overlap: bool = True) -> OffloadPolicy:
    """The policy of one feature's case: everything offloadable offloaded, the feature on, the others off."""
    base = OffloadPolicy(chunk_size=CHUNK, head_group_size=1, resident_slots=1, max_context=CONTEXT,
                         host_attention="off", overlap=overlap, streams=streams)
    if feature == "overlap":
        return dataclasses.replace(base, overlap=True)
    if feature == "host_attention":
        return dataclasses.replace(base, host_attention="all", resident_slots=0)
    if feature == "kv8":
        return dataclasses.replace(base, kv_dtype=user.kv_dtype or "int8", host_attention=user.host_attention)
    if feature == "disk_tier":
        return dataclasses.replace(base, resident_slots=0)
    raise ValueError(f"no self-check case for {feature!r}")


def run_case(feature: str, pair: TinyPair, policy: OffloadPolicy, workdir: Path) -> CaseResult:
    """Runs one case; never raises. A case that cannot be set up (its caches refused by the planner, say) is
    *not checked*: it says nothing about the feature. Anything raised once the feature runs is a failure of it."""
    started = time.perf_counter()
    common = dict(feature=feature, arch=pair.arch, dtype=str(pair.dtype).removeprefix("torch."))
    reference_cache = None
    try:
        if feature == "disk_tier":
            policy = _with_disk_tier(pair, policy, workdir)
        if feature == "kv8":  # lossy: the reference is the same 8-bit cache, run without overlap on plain streams
            plain = "cuda" if pair.device.type == "cuda" else "sync"
            reference_cache = _cache(pair, dataclasses.replace(policy, overlap=False, streams=plain))
        cache = _cache(pair, policy)
    except Exception as exc:  # noqa: BLE001 (the check's own set-up failed: reported as not checked)
        logger.warning("self-check case %s / %s / %s could not be set up: not checked", feature, pair.arch,
                       pair.dtype, exc_info=True)
        if reference_cache is not None:
            reference_cache.release()
        return CaseResult(**common, passed=False, checked=False, error=f"{type(exc).__name__}: {exc}"[:300],
                          seconds=time.perf_counter() - started)
    try:
        if reference_cache is not None:
            reference = greedy(pair.headinfer, pair, reference_cache)
        else:
            reference = greedy_stock(pair)
        actual = greedy(pair.headinfer, pair, cache)
        error, tokens_equal = compare(actual, reference, pair.rtol)
        passed = error < pair.rtol and tokens_equal
        return CaseResult(**common, passed=passed, max_rel_error=error, tokens_equal=tokens_equal,
                          seconds=time.perf_counter() - started)
    except Exception as exc:  # noqa: BLE001 (a crash of the feature is a failed check, reported, not raised)
        logger.warning("self-check case %s / %s / %s raised", feature, pair.arch, pair.dtype, exc_info=True)
        return CaseResult(**common, passed=False, error=f"{type(exc).__name__}: {exc}"[:300],
                          seconds=time.perf_counter() - started)


def _cache(pair: TinyPair, policy: OffloadPolicy) -> HeadInferCache:
    return HeadInferCache(pair.headinfer.config, policy, device=pair.device, dtype=pair.dtype)


def _with_disk_tier(pair: TinyPair, policy: OffloadPolicy, workdir: Path) -> OffloadPolicy:
    """The policy with a host budget that leaves about half the KV homes to files in ``workdir``."""
    probe = _cache(pair, policy)
    probe.allocate(1, probe.shape.head_dim, pair.dtype, pair.device)  # tiny: the homes' real bytes, rings included
    kv = probe.kv_bytes()["host"]
    probe.release()
    workdir.mkdir(parents=True, exist_ok=True)
    return disk_tier_policy(probe.shape, policy, kv, workdir, device_is_cuda=pair.device.type == "cuda")


def disk_tier_policy(shape: ModelShape, policy: OffloadPolicy, kv_bytes: int, workdir: Path, *,
                     device_is_cuda: bool) -> OffloadPolicy:
    """``policy`` with the disk tier in ``workdir`` and a host budget for half the KV homes (``kv_bytes``) plus
    what the planner keeps in host memory on this device with every home in files. Sized by the planner, not by
    hand: on CUDA that includes the disk stream's pinned pieces and write buffers (32 MiB), and a budget without
    them was refused on the first GPU (``needs 32.0 MiB but the budget is 0.0 MiB``)."""
    tiered = dataclasses.replace(policy, disk_dir=str(workdir))
    all_in_files = dataclasses.replace(tiered, host_memory=1)  # the planner moves every home it can to disk
    floor = make_plan(shape, all_in_files, CONTEXT, device_is_cuda=device_is_cuda).host_bytes
    tiered = dataclasses.replace(tiered, host_memory=floor + kv_bytes // 2)
    if make_plan(shape, tiered, CONTEXT, device_is_cuda=device_is_cuda).disk_slots == 0:
        raise RuntimeError("the disk tier case placed no home on disk")
    return tiered


@torch.inference_mode()
def greedy_stock(pair: TinyPair) -> tuple[list[torch.Tensor], list[int]]:
    """(logits [vocab] of the prompt's last token and of each decode step, the greedy tokens) of stock."""
    cache = DynamicCache(config=pair.stock.config)
    logits = [pair.stock(pair.prompt(), **{cache_argument(pair.stock): cache}, use_cache=True).logits[0, -1]]
    return _decode(pair.stock, pair, cache, logits)


@torch.inference_mode()
def greedy(model, pair: TinyPair, cache: HeadInferCache) -> tuple[list[torch.Tensor], list[int]]:
    """The same through a head-wise cache: the prompt in chunks, then greedy decode; the cache is released."""
    try:
        ids = pair.prompt()
        logits = None
        for start in range(0, ids.shape[1], CHUNK):
            logits = model(ids[:, start : start + CHUNK], **{cache_argument(model): cache}, use_cache=True).logits[0, -1]
        return _decode(model, pair, cache, [logits])
    finally:
        cache.release()


def _decode(model, pair: TinyPair, cache, logits: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[int]]:
    tokens = []
    for _ in range(DECODE_STEPS):
        tokens.append(int(logits[-1].argmax()))
        token = torch.tensor([[tokens[-1]]], device=pair.device)
        logits.append(model(token, **{cache_argument(model): cache}, use_cache=True).logits[0, -1])
    return [step.float().cpu() for step in logits], tokens


def compare(actual, reference, rtol: float) -> tuple[float, bool]:
    """(worst relative logit error over the steps both took, whether the greedy tokens agree).

    Tokens are compared up to the first step where the reference's best two logits are closer than the tolerance
    allows: there a correct model may pick either, and the sequences diverge legitimately from then on.
    """
    (a_logits, a_tokens), (r_logits, r_tokens) = actual, reference
    worst = 0.0
    for step, (a, r) in enumerate(zip(a_logits, r_logits)):
        scale = float(r.abs().max())
        worst = max(worst, float((a - r).abs().max()) / max(scale, 1e-30))
        if step == len(r_tokens):
            break
        top2 = r.topk(2).values
        if float(top2[0] - top2[1]) <= 2 * rtol * scale:
            break  # a near-tie: the next inputs may differ, nothing after it is comparable
        if a_tokens[step] != r_tokens[step]:
            return worst, False
    return worst, True
