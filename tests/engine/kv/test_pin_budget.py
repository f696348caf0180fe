"""Pinned memory as a budget (engine/kv/pin_budget.py): the limit, the emulated WDDM refusal, homes past the budget
staying pageable (and the staging ring made for them), and the start-up probe on a runtime that refuses."""

from __future__ import annotations

import gc

import pytest
import torch
from fake_cuda_runtime import FakeRuntime

from engine.errors import InputError, PinningError
from engine.kv.emulated import EmulatedStreams
from engine.kv.pin_budget import PinBudget, parse_limit, probe_pinnable
from engine.kv.pinned import HostMemory
from engine.kv.staging_ring import StagingRing


@pytest.mark.parametrize("text, expected", [("64MiB", 64 << 20), ("4GiB", 4 << 30), ("1.5g", 3 << 29),
                                             ("2GB", 2 * 10**9), ("4096", 4096), ("", None), (None, None)])
def test_the_limit_is_read_in_sizes_people_write(text, expected):
    assert parse_limit(text) == expected


@pytest.mark.parametrize("text", ["lots", "64 parsecs", "0", "-1MiB"])
def test_a_limit_that_is_not_a_size_is_refused_saying_so(text):
    with pytest.raises(InputError, match="HEADINFER_PIN_LIMIT"):
        parse_limit(text)


def test_emulated_pins_past_the_limit_are_refused_and_every_later_one_too():
    streams = EmulatedStreams(pin_limit=1024)
    try:
        first = streams.pinned((128,), torch.float32)  # 512 bytes: within
        assert streams.pin_budget.held == 512 and streams.pin_budget.holds(first)
        with pytest.raises(PinningError, match="pin limit"):
            streams.pinned((256,), torch.float32)  # 512 + 1024 > 1024
        # As under WDDM: after one refusal, a pin that would fit is refused as well.
        with pytest.raises(PinningError, match="earlier pin was refused"):
            streams.pinned((4,), torch.uint8)
        assert streams.pin_budget.held == 512
    finally:
        streams.close()


def test_a_pin_is_given_back_when_its_tensor_goes():
    budget = PinBudget(1 << 20)
    tensor = budget.take(torch.empty(1000, dtype=torch.uint8))
    view = tensor[10:20]
    assert budget.held == 1000 and budget.holds(view)  # a view of pinned memory is pinned
    del tensor, view
    gc.collect()
    assert budget.held == 0 and budget.peak == 1000


def test_homes_are_pinned_within_the_budget_and_pageable_past_it():
    budget = PinBudget(10_000, sticky=True)
    memory = HostMemory(False, fence=lambda: None, budget=budget)  # emulated: plain memory stands for pinned
    within = memory.empty((1000,), torch.float32)  # 4,000 bytes
    past = memory.empty((1200,), torch.float32)  # 4,000 + 4,800 > 10,000 less the 1/8 reserve
    assert budget.holds(within) and not budget.holds(past)
    assert budget.held == 4000 and not budget.refused  # never asked past the budget: nothing refused


def test_a_registration_the_driver_refuses_inside_the_budget_leaves_the_home_pageable():
    log = []
    budget = PinBudget(1 << 30)
    memory = HostMemory(True, fence=lambda: None, runtime=FakeRuntime(log, refuse=True), budget=budget)
    home = memory.empty((1024, 1, 2, 1, 64), torch.float32)
    assert log == ["register", "clear"]  # the runtime's last error cleared: the next CUDA call sees none
    assert not budget.holds(home) and memory.num_registered == 0
    assert budget.limit == 0 and not budget.fits(1)  # the driver's cap: nothing more is tried


def test_the_ring_is_made_only_where_a_limit_is_set_and_its_slots_fit_it():
    unlimited = EmulatedStreams()
    limited = EmulatedStreams(pin_limit=1 << 20)
    try:
        assert StagingRing.for_streams(unlimited, row_bytes=512, rows=4096) is None
        ring = StagingRing.for_streams(limited, row_bytes=512, rows=4096)
        assert ring.buffer_bytes == (1 << 20) // 4 // 4  # a quarter of the room, over four buffers
        assert limited.pin_budget.held == ring.pinned_bytes == 1 << 18
        home = torch.zeros(64, 512, dtype=torch.uint8)
        assert ring.stages(home)
        ring.close()
    finally:
        unlimited.close()
        limited.close()


class CappedRuntime(FakeRuntime):
    """A driver that locks at most ``cap`` bytes in all (WSL2's cumulative wall)."""

    def __init__(self, log: list, cap: int):
        super().__init__(log)
        self.cap, self.locked = cap, {}

    def host_register(self, pointer: int, num_bytes: int) -> int:
        super().host_register(pointer, num_bytes)
        if sum(self.locked.values()) + num_bytes > self.cap:
            return 2
        self.locked[pointer] = num_bytes
        return 0

    def host_unregister(self, pointer: int) -> int:
        super().host_unregister(pointer)
        self.locked.pop(pointer)
        return 0


def test_the_probe_stops_at_the_first_refusal_clears_it_and_unlocks_everything():
    log = []
    runtime = CappedRuntime(log, cap=10 << 20)
    found = probe_pinnable(runtime, 64 << 20, step=4 << 20, margin=0.25)
    assert found == int((8 << 20) * 0.75)  # two steps locked, the third refused
    assert log == ["register"] * 3 + ["clear"] + ["unregister"] * 2
    assert runtime.locked == {}


def test_the_probe_returns_what_was_wanted_when_nothing_refuses():
    log = []
    assert probe_pinnable(CappedRuntime(log, cap=1 << 40), 10 << 20, step=4 << 20) == 10 << 20
    assert log.count("register") == 3 and log.count("unregister") == 3 and "clear" not in log


def test_a_home_whose_room_was_taken_meanwhile_is_unlocked_again_and_stays_pageable():
    """Another tab's cache or the ring's worker pinned between the check and the charge: the registration is
    undone (no page stays locked uncounted) and the home is pageable."""

    class Crowded(PinBudget):
        def take(self, tensor, num_bytes=None):
            raise PinningError("taken meanwhile")

    log = []
    budget = Crowded(1 << 30)
    memory = HostMemory(True, fence=lambda: None, runtime=FakeRuntime(log), budget=budget)
    home = memory.empty((1024, 1, 2, 1, 64), torch.float32)
    assert log == ["register", "unregister"] and memory.num_registered == 0
    assert not budget.holds(home)
