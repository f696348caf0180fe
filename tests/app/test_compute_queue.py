"""The compute device's line, with real threads: first come first served, and a long job made of pieces (a read,
chunk by chunk) gives the device to whoever waits between its pieces, then goes on where it was."""

from __future__ import annotations

import threading
import time

from app.compute_queue import ComputeQueue

PIECE = 0.05


class Device:
    """Asserts that no two jobs ever compute at once; keeps the order of the pieces run."""

    def __init__(self):
        self.lock = threading.Lock()
        self.log: list[str] = []

    def compute(self, name: str, seconds: float = PIECE) -> None:
        assert self.lock.acquire(blocking=False), f"{name} computes while another job holds the device"
        try:
            time.sleep(seconds)
            self.log.append(name)
        finally:
            self.lock.release()


def long_job(queue: ComputeQueue, device: Device, name: str, pieces: int, said: list[str],
             should_leave=lambda: False, started: threading.Event | None = None) -> None:
    ticket = queue.join(f"{name}: reading", pieces * PIECE)
    try:
        for _ in queue.wait_front(ticket, should_leave):
            pass
        for i in range(pieces):
            device.compute(f"{name}{i}")
            if started is not None and i == 2:
                started.set()
            if i < pieces - 1 and not queue.give_way(ticket, should_leave, said.append, PIECE):
                return
    finally:
        queue.leave(ticket)


def short_job(queue: ComputeQueue, device: Device, name: str, waited: dict, seconds: float = PIECE) -> None:
    ticket = queue.join(f"{name}: answering", seconds)
    joined = time.monotonic()
    try:
        said = list(queue.wait_front(ticket, lambda: False, every=0.01))
        waited[name] = time.monotonic() - joined
        waited[f"{name} said"] = said
        device.compute(name, seconds)
    finally:
        queue.leave(ticket)


def test_a_question_during_a_long_read_waits_one_piece_and_the_read_goes_on_where_it_was():
    queue, device, said, waited = ComputeQueue(), Device(), [], {}
    started = threading.Event()
    reader = threading.Thread(target=long_job, args=(queue, device, "A", 40, said), kwargs={"started": started})
    reader.start()
    assert started.wait(5)
    asker = threading.Thread(target=short_job, args=(queue, device, "B", waited))
    asker.start()
    asker.join(5)
    reader.join(10)
    assert not reader.is_alive() and not asker.is_alive()
    assert waited["B"] < 4 * PIECE  # at most the piece under way (the read's rest: 37 pieces, 1.85 s)
    position = device.log.index("B")
    assert 3 <= position < 6  # between two of the read's pieces
    assert [name for name in device.log if name != "B"] == [f"A{i}" for i in range(40)]  # nothing read twice
    assert said and "answering" in said[0]  # the read's tab was told who went first
    assert queue.num_waiting() == 0 and queue.position(queue.join("next", 1.0)) == 0


def test_with_nobody_waiting_a_long_job_keeps_the_device():
    queue, device, said = ComputeQueue(), Device(), []
    started = time.monotonic()
    long_job(queue, device, "A", 10, said)
    assert device.log == [f"A{i}" for i in range(10)] and said == []
    assert time.monotonic() - started < 10 * PIECE + 0.5


def test_two_long_reads_take_turns_piece_by_piece():
    queue, device = ComputeQueue(), Device()
    started = threading.Event()
    first = threading.Thread(target=long_job, args=(queue, device, "A", 8, []), kwargs={"started": started})
    first.start()
    assert started.wait(5)
    second = threading.Thread(target=long_job, args=(queue, device, "B", 4, []))
    second.start()
    first.join(10)
    second.join(10)
    b_pieces = [i for i, name in enumerate(device.log) if name.startswith("B")]
    assert len(b_pieces) == 4 and b_pieces[-1] - b_pieces[0] <= 7  # interleaved, not all B after all A
    assert [n for n in device.log if n.startswith("A")] == [f"A{i}" for i in range(8)]


def test_a_paused_read_that_is_cancelled_leaves_the_line_and_the_other_job_is_not_held_up():
    queue, device, said, waited = ComputeQueue(), Device(), [], {}
    cancel = threading.Event()
    started = threading.Event()
    reader = threading.Thread(target=long_job, args=(queue, device, "A", 40, said),
                              kwargs={"should_leave": cancel.is_set, "started": started})
    reader.start()
    assert started.wait(5)
    asker = threading.Thread(target=short_job, args=(queue, device, "B", waited, 1.0))
    asker.start()
    while not said:  # the read is paused behind the question
        time.sleep(0.01)
    cancel.set()
    reader.join(2)
    assert not reader.is_alive()  # left while paused, within a poll of the line
    assert asker.is_alive()  # the question still computes, undisturbed
    asker.join(5)
    assert device.log[-1] == "B" and len([n for n in device.log if n.startswith("A")]) <= 5


def test_those_behind_a_job_that_gives_way_are_told_they_wait_about_one_piece():
    queue = ComputeQueue()
    reading = queue.join("reading 7,000 tokens", 300.0)
    queue.give_way(reading, lambda: False, lambda line: None, piece_seconds=4.0)  # nobody waits: it goes on
    asking = queue.join("answering a question", 20.0)
    assert 3.0 <= queue.wait_seconds(asking) <= 4.0  # the piece under way, not the read's 300 s
    holding = ComputeQueue()
    whole = holding.join("reading 7,000 tokens", 300.0)  # a job that never gives way: its whole rest
    assert holding.wait_seconds(holding.join("answering a question", 20.0)) > 290 and whole.piece_seconds is None
