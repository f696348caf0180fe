"""The streams seam: backends chosen from outside, emulated CUDA semantics, and the happens-before checker."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import engine
from engine.kv import streams as kv_streams
from engine.kv.emulated import EmulatedStreams
from engine.errors import RaceError
from engine.kv.host_attention import HostAttention


# -- choosing a backend --------------------------------------------------------------------------------
def test_environment_variable_overrides_auto_and_policy_names_win(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.delenv(kv_streams.ENV_BACKEND, raising=False)
    assert kv_streams.resolve("auto", cpu) == "sync"
    monkeypatch.setenv(kv_streams.ENV_BACKEND, "emulated")
    assert kv_streams.resolve("auto", cpu) == "emulated"
    assert kv_streams.resolve("sync", cpu) == "sync"  # an explicit policy choice is not overridden
    monkeypatch.setenv(kv_streams.ENV_BACKEND, "bogus")
    with pytest.raises(ValueError, match="HEADINFER_STREAMS"):
        kv_streams.resolve("auto", cpu)


def test_backends_that_need_another_device_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        kv_streams.resolve("cuda", torch.device("cpu"))
    with pytest.raises(ValueError, match="run on the CPU"):
        kv_streams.resolve("emulated", torch.device("meta"))
    with pytest.raises(ValueError, match="streams must be one of"):
        engine.OffloadPolicy(streams="fast")


@torch.inference_mode()
def test_a_cache_runs_on_the_backend_the_environment_names(monkeypatch):
    from transformers import AutoModelForCausalLM, LlamaConfig

    monkeypatch.setenv(kv_streams.ENV_BACKEND, "emulated")
    cfg = LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, vocab_size=50)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="headinfer").eval()
    cache = engine.HeadInferCache(model.config, device="cpu", resident_slots=0, head_group_size=1)
    model(torch.tensor([[1, 2, 3, 4]]), past_key_values=cache)
    assert cache.transfer.streams.name == "emulated" and cache.transfer.streams.checker.num_checked > 0
    cache.release()


# -- emulated CUDA semantics ------------------------------------------------------------------------------
def test_an_emulated_copy_reads_its_source_when_it_runs_not_when_issued():
    backend = EmulatedStreams(seed=0)
    side, gate = backend.new_stream("side"), threading.Event()
    side.enqueue(gate.wait)  # the stream is busy: what follows runs later
    src, dst = torch.zeros(4), torch.full((4,), -1.0)
    with backend.use(side):
        backend.copy(dst, src)
    src.fill_(7.0)  # a host write after the copy was issued but before it ran
    gate.set()
    side.synchronize()
    assert torch.equal(dst, torch.full((4,), 7.0))
    backend.close()


def test_waits_capture_the_generation_current_when_issued_and_unrecorded_events_are_no_ops():
    backend = EmulatedStreams(seed=0)
    side, gate = backend.new_stream("side"), threading.Event()
    event = backend.event()
    backend.current().wait_event(event)  # never recorded: returns at once (it would deadlock otherwise)
    event.record(backend.current())  # generation 1, complete at once (the compute stream)
    side.enqueue(gate.wait)
    event.record(side)  # generation 2: not reached while the side stream is blocked
    assert not event.query()
    gate.set()
    event.synchronize()
    assert event.query()
    backend.close()


# -- the checker -------------------------------------------------------------------------------------------
def _copy_then_read(backend, *, order: str) -> torch.Tensor:
    """A side stream writes ``dst``; the caller reads it after waiting as ``order`` says."""
    side = backend.new_stream("side")
    src, dst = torch.ones(8), torch.zeros(8)
    done = backend.event()
    with backend.use(side):
        backend.copy(dst, src)
        done.record(side)
    if order == "stream wait":
        backend.current().wait_event(done)
        backend.read(dst, "dst on compute")  # the compute stream reads: ordered by its wait
    elif order == "stream wait, host read":
        backend.current().wait_event(done)
        backend.host_read(dst, "dst on the host")  # the *thread* never waited: a race on a GPU
    elif order == "synchronize":
        done.synchronize()
        backend.host_read(dst, "dst on the host")
    else:
        backend.read(dst, "dst on compute")
    return dst


@pytest.mark.parametrize("order", ["stream wait", "synchronize"])
def test_accesses_ordered_by_an_event_pass(order):
    backend = EmulatedStreams(seed=0)
    assert torch.equal(_copy_then_read(backend, order=order), torch.ones(8))
    assert backend.checker.races == []
    backend.close()


@pytest.mark.parametrize("order", ["none", "stream wait, host read"])
def test_unordered_accesses_raise_naming_both_sites(order):
    backend = EmulatedStreams(seed=0)
    with pytest.raises(RaceError, match=r"stream side wrote .*_copy_then_read.* then .* reads dst"):
        _copy_then_read(backend, order=order)
    backend.close()


def test_freeing_a_buffer_a_copy_may_still_read_is_a_race():
    backend = EmulatedStreams(seed=0)
    side = backend.new_stream("side")
    src, dst = torch.ones(8), torch.zeros(8)
    with backend.use(side):
        backend.copy(dst, src)
    with pytest.raises(RaceError, match="memory being freed"):
        backend.forget(src)
    side.synchronize()
    backend.forget(dst)  # after a synchronize: fine
    backend.close()


def test_worker_threads_are_ordered_only_through_submit_and_join():
    backend = EmulatedStreams(seed=0)
    data = torch.zeros(4)
    backend.host_write(data, "written before submit")
    gate = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        future = backend.submit(pool, lambda: gate.wait() and backend.host_write(data, "written by the worker"))
        with pytest.raises(RaceError, match="joined before it finished"):  # claims a wait it did not do
            backend.joined(future)
        gate.set()
        future.result()
        with pytest.raises(RaceError):  # the caller waited, but never told the checker: not ordered
            backend.host_read(data, "read after the worker")
        backend.joined(future)
        backend.host_read(data, "read after the worker, joined")
    backend.close()


# -- the host-attention fix: the queries are read only once they have landed -------------------------------
def test_host_attention_reads_its_queries_only_after_ready():
    """On CUDA the queries are still being copied when ``start`` returns; ``ready`` waits for them. A kernel that
    read them earlier (the bug: folding on the calling thread) attends garbage."""
    torch.manual_seed(0)
    kv = torch.randn(40, 1, 2, 2, 16)  # a home: [tokens, B, K/V, g, D]
    query = torch.randn(1, 4, 1, 16)  # [B, H, Q, D], n_rep 2
    expected = HostAttention(use_native=False).attend(query, [kv], 0, 40, scaling=0.25)
    landing = torch.full_like(query, float("nan"))  # what the landing buffer holds before the copy lands
    job = HostAttention(use_native=False).start(landing, [kv], 0, 40, scaling=0.25,
                                                ready=lambda: landing.copy_(query))
    job.wait()
    assert torch.allclose(job.result(), expected, atol=1e-6)
