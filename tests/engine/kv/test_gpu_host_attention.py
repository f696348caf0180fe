"""Host attention on CUDA (issue 12): every tiny family in fp32 and bf16, every offloaded group attended on the
host and a split with the other half streamed, against stock transformers on the same GPU. Here the host half
really waits for the d2h append of the current token and the queries' copy (``Transfer.to_host``) while the
device half streams over h2d. Marked ``gpu``: run by ``python -m benchmarks.gpu.gpu_all``."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import DynamicCache

import engine
from archs import build_pair, tiny_configs

pytestmark = pytest.mark.gpu

PROMPT_LEN, CHUNK = 45, 16
RTOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


@pytest.fixture(scope="module", params=[(n, d) for n in sorted(tiny_configs()) for d in (torch.float32, torch.bfloat16)],
                ids=lambda p: f"{p[0]}-{str(p[1]).removeprefix('torch.')}")
def pair(request, tmp_path_factory):
    name, dtype = request.param
    stock, headinfer = build_pair(name, tmp_path_factory.mktemp(name), dtype=dtype, device="cuda")
    return name, dtype, stock, headinfer


def rel_diff(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.float() - expected.float()).abs().max() / expected.float().abs().max())


@pytest.mark.parametrize("split", [False, True], ids=["all-on-host", "split"])
@torch.inference_mode()
def test_decode_with_host_attention_matches_stock_on_cuda(pair, split):
    name, dtype, stock, headinfer = pair
    ids = torch.randint(0, stock.config.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(7)).cuda()
    stock_cache = DynamicCache(config=stock.config)
    expected = [stock(ids, past_key_values=stock_cache, use_cache=True).logits[:, -1]]
    cache = engine.HeadInferCache(headinfer.config, device="cuda", head_group_size=1, resident_slots=0,
                                  chunk_size=CHUNK, host_attention="off" if split else "all")
    if split:  # half the bytes on the host whatever this machine's rates say: both halves run every step
        cache.plan = dataclasses.replace(cache.plan, host_attention="auto", host_share=0.5)
    actual = [torch.cat([headinfer(ids[:, s : s + CHUNK], past_key_values=cache).logits
                         for s in range(0, PROMPT_LEN, CHUNK)], dim=1)[:, -1]]
    for _ in range(12):
        token = expected[-1].argmax(-1, keepdim=True)
        expected.append(stock(token, past_key_values=stock_cache, use_cache=True).logits[:, -1])
        actual.append(headinfer(token, past_key_values=cache).logits[:, -1])
    for step, (a, e) in enumerate(zip(actual, expected)):
        assert rel_diff(a, e) < RTOL[dtype], (name, dtype, split, step)
    assert cache.host_attention_seconds > 0 and cache.kv_bytes()["host"] > 0
