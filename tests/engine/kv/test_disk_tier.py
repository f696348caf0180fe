"""The disk tier: homes beyond the host budget live in files, exactly; faults are clear and lose nothing."""

from __future__ import annotations

import copy
import errno
import os
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import engine
from engine.kv import disk as disk_module
from engine.errors import DiskTierError, PlanError

CONTEXT, CHUNK = 200, 64


def models():
    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=97, max_position_embeddings=512)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="headinfer").eval()


def ids_of(n: int) -> torch.Tensor:
    return torch.randint(0, 97, (1, n), generator=torch.Generator().manual_seed(3))


def feed(model, ids, cache, chunk=CHUNK):
    return torch.cat([model(ids[:, s : s + chunk], past_key_values=cache).logits
                      for s in range(0, ids.shape[1], chunk)], dim=1)


def ram_cache(model):
    return engine.HeadInferCache(model.config, device="cpu", max_context=256, head_group_size=1)


def tier_cache(model, folder):
    """Three quarters of the KV homes on the disk tier, in ``folder``."""
    return engine.HeadInferCache(model.config, device="cpu", max_context=256, head_group_size=1,
                                 disk_dir=str(folder), host_memory=quarter_budget(model))


def assert_usable_to(length: int, model, ids, tier) -> None:
    """After a failed forward, the tier cropped to ``length`` (the last complete chunk, as DocumentSession does)
    continues exactly as an all-in-RAM cache that read the same tokens."""
    tier.crop_to(length)
    ram = ram_cache(model)
    feed(model, ids[:, :length], ram)
    rest = ids[:, length:]
    assert torch.equal(model(rest, past_key_values=ram).logits, model(rest, past_key_values=tier).logits)


def quarter_budget(model) -> int:
    """A host budget that leaves a quarter of the KV in RAM (on a CPU machine it covers weights too)."""
    ram = ram_cache(model)
    kv = 4 * 2 * 256 * 2 * 16 * 4  # layers x KV heads x tokens x (K, V) x head_dim x fp32
    return ram.plan.host_bytes - kv + kv // 4


@torch.inference_mode()
def test_quarter_of_the_kv_in_ram_gives_identical_logits_and_greedy_tokens(tmp_path):
    model = models()
    ids = ids_of(CONTEXT)
    ram = ram_cache(model)
    tier = tier_cache(model, tmp_path)
    assert tier.plan.fits and tier.plan.disk_slots == 6  # 6 of 8 slots: three quarters of the KV
    expected, actual = feed(model, ids, ram), feed(model, ids, tier)
    assert torch.equal(actual, expected)
    for _ in range(8):  # greedy decode, both
        token = expected[:, -1:].argmax(-1)
        expected, actual = model(token, past_key_values=ram).logits, model(token, past_key_values=tier).logits
        assert torch.equal(actual, expected)
    kv = tier.kv_bytes()
    assert kv["disk"] == 3 * kv["host"] and kv["host"] + kv["disk"] == ram.kv_bytes()["host"]
    files = list(tmp_path.glob("kv-*/*.kv"))
    assert len(files) == 6 and sum(f.stat().st_size for f in files) == kv["disk"]
    tier.release()
    assert not list(tmp_path.glob("kv-*"))  # the files go with the cache


def test_a_disk_budget_too_small_is_refused_before_anything_is_written(tmp_path):
    model = models()
    with pytest.raises(PlanError, match="disk tier: needs"):
        engine.HeadInferCache(model.config, device="cpu", max_context=256, head_group_size=1, disk_dir=str(tmp_path),
                              host_memory=quarter_budget(model), disk_memory=1024)
    assert not list(tmp_path.iterdir())


@torch.inference_mode()
def test_a_full_disk_is_a_clear_error_and_leaves_no_half_made_cache(tmp_path, monkeypatch):
    model = models()
    cache = engine.HeadInferCache(model.config, device="cpu", max_context=256, head_group_size=1,
                                  disk_dir=str(tmp_path), host_memory=quarter_budget(model))

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(disk_module.os, "posix_fallocate", no_space)
    with pytest.raises(DiskTierError, match="No space left"):
        model(ids_of(10), past_key_values=cache)
    assert cache.get_seq_length() == 0 and cache.layers[0].homes is None
    assert not list(tmp_path.glob("kv-*/*"))
    monkeypatch.undo()
    model(ids_of(10), past_key_values=cache)  # space again: the same cache works
    assert cache.get_seq_length() == 10


@torch.inference_mode()
def test_deleted_folder_keeps_the_read_document_and_refuses_growth_clearly(tmp_path):
    model = models()
    ids = ids_of(CONTEXT)
    ram = ram_cache(model)
    tier = tier_cache(model, tmp_path)
    feed(model, ids, ram), feed(model, ids, tier)
    shutil.rmtree(next(tmp_path.glob("kv-*")))  # a user cleans up the folder mid-session
    token = ids[:, :1]
    assert torch.equal(model(token, past_key_values=tier).logits, model(token, past_key_values=ram).logits)
    with pytest.raises(DiskTierError, match="cannot make"):
        tier.reserve(1000)  # growing needs new files
    assert tier.get_seq_length() == CONTEXT + 1  # what was read is still there
    assert torch.equal(model(token, past_key_values=tier).logits, model(token, past_key_values=ram).logits)


@torch.inference_mode()
def test_a_forward_that_fails_midway_leaves_the_document_usable_to_its_last_chunk(tmp_path, monkeypatch):
    from engine.kv import kernels

    model = models()
    ids = ids_of(CONTEXT)
    tier = tier_cache(model, tmp_path)
    feed(model, ids[:, :128], tier)
    real, calls = kernels.attend_span, []

    def crash(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("killed mid-chunk")
        return real(*args, **kwargs)

    monkeypatch.setattr(kernels, "attend_span", crash)
    with pytest.raises(RuntimeError, match="mid-chunk"):
        model(ids[:, 128:], past_key_values=tier)
    monkeypatch.setattr(kernels, "attend_span", real)
    assert_usable_to(128, model, ids, tier)


@torch.inference_mode()
def test_disk_homes_are_read_on_the_disk_worker_and_a_failed_read_loses_nothing(tmp_path, monkeypatch):
    from engine.kv import disk_stream

    model = models()
    ids = ids_of(CONTEXT)
    tier = tier_cache(model, tmp_path)
    feed(model, ids[:, :128], tier)
    assert tier.transfer.disk.num_fetches > 0  # every disk home's past went through the worker ...
    assert tier.disk_tier.num_reads > 0 and tier.transfer.disk.num_paged == 0  # ... read with preadv

    def failing_read(*args):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(disk_stream.DiskStream, "_copy_rows", failing_read)
    with pytest.raises(OSError, match="Input/output"):
        model(ids[:, 128:], past_key_values=tier)
    monkeypatch.undo()
    assert_usable_to(128, model, ids, tier)


def test_disk_stream_drain_waits_in_every_thread_and_reports_a_failure_once():
    import threading
    import time

    from engine.kv.disk_stream import DiskStream
    from engine.errors import DiskStreamError
    from engine.kv.streams import SyncStreams

    stream = DiskStream(SyncStreams())
    gate = threading.Event()
    stream._submit(gate.wait)
    returned = {}

    def drainer(name):
        stream.drain()
        returned[name] = time.perf_counter()

    threads = [threading.Thread(target=drainer, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    opened = time.perf_counter()
    gate.set()
    for thread in threads:
        thread.join()
    assert len(returned) == 3 and min(returned.values()) >= opened  # nobody returned before the job ended

    def broken():
        raise OSError(errno.EIO, "Input/output error")

    stream._submit(broken)
    refused = stream._submit(lambda: None)  # after an unreported failure: refused, not run on bad rows
    with pytest.raises(OSError, match="Input/output"):
        stream.drain()
    assert isinstance(refused.exception(), DiskStreamError)
    stream.drain()  # reported once
    assert stream._submit(lambda: 7).result() is None and not stream._jobs[-1].exception()
    stream.close()


@pytest.mark.parametrize("overlap", [True, False])
def test_disk_homes_are_prefetched_with_overlap_and_all_fetched_on_demand_without(tmp_path, overlap):
    """What the CUDA disk-tier test counts, on emulated streams: with overlap the next group's fetch is issued
    ahead (a miss or two), without it every fetch waits on demand (the GPU test once expected few there too)."""
    model, ids = models(), ids_of(CONTEXT)
    tier = engine.HeadInferCache(model.config, device="cpu", max_context=256, head_group_size=1, resident_slots=0,
                                 disk_dir=str(tmp_path), host_memory=quarter_budget(model), overlap=overlap,
                                 streams="emulated")
    with torch.inference_mode():
        feed(model, ids, tier)
        for _ in range(4):
            model(ids[:, :1], past_key_values=tier)
    transfer = tier.transfer
    assert tier.plan.disk_slots > 0 and transfer.disk.num_fetches > 0
    if overlap:
        assert transfer.num_on_demand <= 2 * len(tier.kv_layers) < transfer.num_fetches
    else:
        assert transfer.num_on_demand == transfer.num_fetches
