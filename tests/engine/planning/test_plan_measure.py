"""Measured, not guessed: the dry-run activation peak (with a stand-in for torch.cuda's counters on the CPU) and
the FLOP-rate probe that waits for the device before reading the clock."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from engine.planning import machine as telemetry
from engine.planning.shape import ModelShape
from engine.read_time import flops

CONFIG = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=97, max_position_embeddings=256)


def tiny():
    return AutoModelForCausalLM.from_config(CONFIG, attn_implementation="headinfer").eval()


class Counters:
    """torch.cuda's memory counters, scripted: the dry run allocates 300 bytes above 1000 at its peak."""

    def __init__(self):
        self.calls = []

    def synchronize(self, device=None):
        self.calls.append("synchronize")

    def memory_allocated(self, device=None):
        self.calls.append("memory_allocated")
        return 1000

    def reset_peak_memory_stats(self, device=None):
        self.calls.append("reset")

    def max_memory_allocated(self, device=None):
        self.calls.append("max")
        return 1300


def test_dry_run_measures_the_peak_above_what_was_allocated_once_per_chunk():
    model, counters = tiny(), Counters()
    assert telemetry.measure_activation_peak(model, 16, 97, cuda=counters) == 300
    # Synchronised before reading the baseline and before reading the peak; the peak was reset first.
    assert counters.calls == ["synchronize", "memory_allocated", "reset", "synchronize", "max"]
    assert telemetry.measure_activation_peak(model, 16, 97, cuda=counters) == 300
    assert len(counters.calls) == 5  # measured once per (model, chunk)


def test_no_measurement_off_cuda():
    assert telemetry.measure_activation_peak(tiny(), 16, 97) is None


def test_flop_probe_waits_for_the_device_around_the_timed_forward(monkeypatch):
    events = []
    monkeypatch.setattr(flops, "synchronize", lambda device: events.append(("sync", device.type)))
    monkeypatch.setattr(flops.time, "perf_counter", lambda: events.append(("clock",)) or float(len(events)))
    model = tiny()
    shape = ModelShape.from_config(CONFIG, dtype_bytes=4)
    rate = flops.measured_flop_rate(model, shape, num_tokens=32)
    assert rate > 0
    assert events == [("sync", "cpu"), ("clock",), ("sync", "cpu"), ("clock",)]


def test_host_and_link_rates_are_measured_at_once():
    """The host steps run on a thread while the link steps run: a link step that waits for a host pass to be
    under way proves they overlap, and each side's rate is its bytes over its own seconds."""
    import threading
    import time

    from engine.planning.machine_rates import measure_together

    host_running = threading.Event()

    def host_step():
        host_running.set()
        time.sleep(0.01)
        return 10_000_000  # 10 MB in ~10 ms: ~1 GB/s

    def link_step():
        assert host_running.wait(5)  # only ever measured beside host attention
        begin = time.perf_counter()
        time.sleep(0.02)
        return 40_000_000, time.perf_counter() - begin  # 40 MB in ~20 ms: ~2 GB/s

    host, link = measure_together(host_step, link_step, repeats=3)
    assert 0.5 < host < 1.1 and 1.0 < link < 2.1


def test_a_dry_run_after_a_failed_forward_ignores_the_route_it_left():
    from engine.kv import route

    route.publish(0, object(), torch.zeros(1))  # an update whose attention never ran (the forward raised)
    assert telemetry.measure_activation_peak(tiny(), 8, 97, cuda=Counters()) == 300
    model = tiny()
    route.publish(0, object(), torch.zeros(1))
    assert flops.measured_flop_rate(model, ModelShape.from_config(CONFIG, dtype_bytes=4), num_tokens=16) > 0
